"""The options of the manifest commands (`isood verify`, `card`, `publish`, `merge`), one description each
(``isood.core.optspec``)."""

from __future__ import annotations

from dataclasses import dataclass

from isood.core.defaults import VERIFY_MODES
from isood.core.optspec import REQUIRED, option
from isood.core.shared_options import out_option

__all__ = ["VerifyOptions", "CardOptions", "PublishOptions", "MergeOptions"]


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """`isood verify`."""

    manifest_dir: str = option(REQUIRED, kind="path", argument=True, metavar="MANIFEST_DIR",
                               help="A manifest directory.")
    verify: str = option("full", choices=VERIFY_MODES, metavar="MODE",
                         help="full: every file's hash; fast: sizes, every table and small file hashed, larger files "
                              "when their size, mtime or inode changed since they last verified on this machine.")


@dataclass(frozen=True, kw_only=True)
class CardOptions:
    """`isood card`."""

    manifest_dir: str = option(REQUIRED, kind="path", argument=True, metavar="MANIFEST_DIR",
                               help="A manifest directory (e.g. one written without a dataset card).")


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    """`isood publish`."""

    manifest_dir: str = option(REQUIRED, kind="path", argument=True, metavar="MANIFEST_DIR",
                               help="A manifest directory (must pass `isood verify` and have a README.md card).")
    repo_id: str = option(REQUIRED, metavar="USER/NAME", help="Hub dataset repository (created if missing).")
    private: bool = option(False, help="Create the repository as private.", secondary="--public")
    revision: str | None = option(None, metavar="TAG",
                                  help="Tag to create (default: v<dataset version>, e.g. v1.2.0).")
    dry_run: bool = option(False, help="List exactly the files and sizes that would be uploaded; no network.",
                           secondary="--upload")
    token_from_env: bool = option(False, help="Take the token only from $HF_TOKEN (default: huggingface_hub's "
                                              "usual sources).", secondary="--token-from-hub-login")
    out: str | None = out_option("With --dry-run: copy the exact upload folder here. Otherwise: write publish.json "
                                 "(repo, tag, commit) here.", required=False)
    include_features: bool = option(False, secondary="--no-features",
                                    help="Also upload the feature shards (features-id/, features-test/, *.npy; "
                                         "~24 GB of test features at IS-OOD's size).")


@dataclass(frozen=True, kw_only=True)
class MergeOptions:
    """`isood merge`."""

    parts: tuple[str, ...] = option(REQUIRED, argument=True, metavar="PART_DIR...", least=1,
                                    help="The part directories of one job array (written with --num-shards N "
                                         "--shard-index i).")
    out: str = out_option("Output directory: the manifest a single run writes.")
