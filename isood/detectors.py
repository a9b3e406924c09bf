"""The OOD detectors as objects: ``isood.detectors.KNN(k=50)``, ``isood.detectors.MSP()``, ... (the classes of
``isood.science.detectors``; numpy in, numpy out). ``isood.evaluate`` and ``Benchmark.evaluate`` take them in
``detectors=[...]`` beside or instead of the ``--detectors`` text; ``d.spec()`` is the text of an object and
``parse_detectors(text)`` the objects of a text, so the two are one description."""

from isood.science.detectors import (ASH, DICE, GLMCM, KNN, MCM, MDS, MSP, ODIN, Detector, Energy, GradNorm,
                                        KLMatching, MaxLogit, RankFeat, ReAct, ViM, available_detectors,
                                        detector_parameters, get_detector, parse_detectors, register_detector)

__all__ = ["Detector", "MSP", "MaxLogit", "Energy", "ODIN", "MDS", "KNN", "ViM", "ReAct", "DICE", "ASH", "RankFeat",
           "GradNorm", "KLMatching", "MCM", "GLMCM", "available_detectors", "detector_parameters", "get_detector",
           "parse_detectors", "register_detector"]
