"""The options of the commands that check and ship a manifest: ``isood verify``, ``card``, ``publish`` and
``merge`` (their work is ``manifests.verify``, ``manifests.card`` and ``manifests.hub``)."""
