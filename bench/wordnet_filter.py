"""Time the ImageNet-OOD class filter on the real lists (21k candidates vs 1k ID) and print its counts.

Prints: WordNet load time, the first filter (cold caches), repeats (warm caches: each synset's ancestors are
computed once per process), and the cold/warm ratio; plus candidates/kept/dropped per rule for the default
exclusion, exclude=() and --sisters-only. Prints one SUMMARY line and appends a row to bench/results.local.md
(``--no-record`` to skip; ``--full`` is accepted for run_all and changes nothing: these are the real sizes).
Run: .venv/bin/python bench/wordnet_filter.py
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import record, summary  # noqa: E402

from wordnet_tools import Hierarchy, filter_classes, load_synset_list, load_wordnet, summarise


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="same sizes (the real lists)")
    ap.add_argument("--no-record", action="store_true", help="do not append to bench/results.local.md")
    args = ap.parse_args(argv)
    wn, t_load = _timed(load_wordnet)
    cand, ids = load_synset_list("21k"), load_synset_list("1k")
    h = Hierarchy(wn)
    runs = [("default exclude (organism.n.01)", {}), ("exclude=()", {"exclude": ()}),
            ("sisters_only", {"sisters_only": True}), ("sisters_only, exclude=()", {"exclude": (), "sisters_only": True})]
    print(f"WordNet load: {t_load:.2f} s; candidates 21k = {len(cand)}, ID 1k = {len(ids)}")
    cold, kept = None, None
    for label, kw in runs:
        df, t = _timed(lambda: filter_classes(cand, ids, h, **kw))
        cold = t if cold is None else cold
        s = summarise(df)
        kept = dict(zip(s["rule"], s["classes"])).get("", 0) if kept is None else kept
        parts = ", ".join(f"{r or 'kept'}={n}" for r, n in zip(s["rule"], s["classes"]))
        print(f"{label}: {t:.2f} s; candidates={len(df)}: {parts}")
    _, warm = _timed(lambda: filter_classes(cand, ids, h))
    print(f"filter cold {cold:.2f} s / warm {warm:.2f} s = {cold / warm:.1f}x (closures cached in the Hierarchy)")
    text = (f"21k vs 1k: WordNet load {t_load:.2f} s, filter cold {cold:.2f} s / warm {warm:.2f} s = {cold / warm:.1f}x "
            f"(cached closures); {kept} of {len(cand)} candidates kept (default exclusion)")
    summary("wordnet_filter", text)
    if not args.no_record:
        record("wordnet_filter.py", f"candidates 21k ({len(cand)}), ID 1k ({len(ids)}), 4 filter variants", text)


if __name__ == "__main__":
    main()
