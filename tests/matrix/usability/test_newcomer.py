"""A newcomer's path: each row names its guard and fails with the guard removed.

* A model named by its Hugging Face Hub name when the Hub cannot be reached (``HF_HUB_OFFLINE`` unset): one line
  naming ``HF_HUB_OFFLINE=1`` and what to pass instead (a ``local-dir:``, ``isood dev tiny-models``), in about a
  second instead of huggingface_hub's retries (guard: ``isood.core.hub_access`` in ``isood.features.clip.load_clip``,
  ``generation.pipeline.load_pipeline``, ``generation.fingerprint.expected_fingerprint``,
  ``isood.classifiers.named``). The runs are subprocesses with the environment a user has (``HF_HUB_OFFLINE``
  unset, the Hub at a closed local port, an empty cache); their time is bounded by a timeout, not asserted (the
  measured times are in the docs' troubleshooting page).
* With ``HF_HUB_OFFLINE=1`` the line says so.
* ``isood dev tiny-models DIR`` refuses a non-empty DIR it did not write, in one line, changing nothing (guard:
  ``isood.dev.tiny_models.write_tiny_models``).
* A bound is said as a person types it: ``--seed`` must be in [0, 2147483647], not [0, 2.14748e+09], in the
  one-line refusal and in ``--help`` (guard: ``isood.core.optspec.format_bound``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from isood.core.hub_access import HubAccess, _probe

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
#: Each subprocess imports torch and the model libraries (~10 s here); a run that waited for huggingface_hub's
#: retries took ~60 s. The bound keeps a hung run from stalling the suite.
TIMEOUT = 240


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment without network: HF_HUB_OFFLINE unset, the Hub's endpoint refusing connections at once
    (as a machine without DNS does), an empty Hugging Face and torch cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HOME=str(tmp_path / "hf"),
               HF_HUB_CACHE=str(tmp_path / "hf" / "hub"), TORCH_HOME=str(tmp_path / "torch"),
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _assert_offline_line(line: str, flag: str) -> None:
    assert "\n" not in line and "Traceback" not in line, line
    assert "HF_HUB_OFFLINE=1" in line and "cannot be reached" in line, line
    assert flag in line and "isood dev tiny-models" in line, line


def test_extract_with_a_hub_clip_and_no_network_is_one_line_naming_hf_hub_offline(tmp_path, tiny_images):
    """Guard: isood.features.clip.load_clip -> isood.core.hub_access (probe, offline mode, the line)."""
    r = subprocess.run([sys.executable, "-c", "import sys; from isood.cli import main; sys.exit(main())", "extract",
                        "--images", str(tiny_images), "--clip", "ViT-B-32:openai", "--device", "cpu",
                        "--out", str(tmp_path / "feat")], env=_offline_env(tmp_path), capture_output=True,
                       text=True, timeout=TIMEOUT, cwd=tmp_path)
    from isood.core.progress import is_progress_line

    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not is_progress_line(ln)]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    _assert_offline_line(lines[0], "--clip local-dir:PATH")
    assert "--clip ViT-B-32:openai" in lines[0]
    assert not (tmp_path / "feat").exists()


_LOADERS = """
import json, sys
from isood.core.errors import MissingWeightsError
from isood.classifiers.named import adapter_from_option
from generation.fingerprint import expected_fingerprint
from generation.pipeline import GeneratorSettings, load_pipeline

calls = {"model": lambda: adapter_from_option("resnet50"),
         "fingerprint": lambda: expected_fingerprint(GeneratorSettings(), "cpu"),
         "pipeline": lambda: load_pipeline("stabilityai/sdxl-turbo", device="cpu")}
out = {}
for name, call in calls.items():
    try:
        call()
        out[name] = "loaded"
    except MissingWeightsError as e:
        out[name] = str(e)
print(json.dumps(out))
"""


def test_hub_classifier_and_pipeline_with_no_network_are_one_line_naming_hf_hub_offline(tmp_path):
    """Guards: isood.classifiers.named (timm name), generation.fingerprint.expected_fingerprint and
    generation.pipeline.load_pipeline."""
    r = subprocess.run([sys.executable, "-c", _LOADERS], env=_offline_env(tmp_path), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    _assert_offline_line(got["model"], "--checkpoint PATH")
    for name in ("fingerprint", "pipeline"):
        _assert_offline_line(got[name], "--pipeline local-dir:PATH")
        assert "stabilityai/sdxl-turbo" in got[name]


def test_with_hf_hub_offline_set_the_line_says_so():
    """Guard: HubAccess.missing (the offline case): conftest sets HF_HUB_OFFLINE=1, as `make test` does."""
    from isood.features.clip import load_clip
    from isood.core.errors import MissingWeightsError

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(MissingWeightsError) as e:
        load_clip("ViT-B-32:openai", device="cpu")
    line = str(e.value)
    assert "\n" not in line and "HF_HUB_OFFLINE=1 forbids downloading" in line, line
    assert "--clip local-dir:PATH" in line and "isood dev tiny-models" in line


# ------------------------------------------------------------------------------------------------ the probe
class _Answer404(BaseHTTPRequestHandler):
    def do_HEAD(self):  # noqa: N802 -- http.server's naming
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


def test_probe_any_http_answer_is_reachable_and_a_refusal_or_silence_is_not():
    """The probe's three outcomes against local endpoints: an HTTP answer (even 404), a refused connection, and a
    server that accepts but never answers (bounded by the probe's timeout)."""
    server = HTTPServer(("127.0.0.1", 0), _Answer404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _probe(f"http://127.0.0.1:{server.server_port}", 5.0) is None
    finally:
        server.shutdown()
        server.server_close()
    port = _closed_port()
    refused = _probe(f"http://127.0.0.1:{port}", 5.0)
    assert refused is not None and refused.startswith(f"127.0.0.1:{port}: ") and "\n" not in refused
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        quiet = _probe(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5)
    assert quiet is not None and "127.0.0.1" in quiet


def test_the_three_lines_of_hub_access():
    reachable = HubAccess("https://huggingface.co", offline=False)
    assert reachable.usable
    line = reachable.missing("--clip X:y", "pass --clip local-dir:PATH", RuntimeError("404\nnot found"))
    assert line == "--clip X:y: could not be loaded (404 not found): pass --clip local-dir:PATH"
    down = HubAccess("https://huggingface.co", offline=False, unreachable="huggingface.co: no answer within 3 s")
    assert not down.usable and "(huggingface.co: no answer within 3 s)" in down.missing("--clip X:y", "pass Z")
    assert "HF_HUB_OFFLINE=1" in down.missing("--clip X:y", "pass Z")
    off = HubAccess("https://huggingface.co", offline=True)
    assert not off.usable and "HF_HUB_OFFLINE=1 forbids downloading" in off.missing("--clip X:y", "pass Z")


# ------------------------------------------------------------------------------------------------ tiny-models DIR
def test_tiny_models_refuses_a_foreign_non_empty_dir_in_one_line_and_changes_nothing(tmp_path, cli):
    """Guard: isood.dev.tiny_models.write_tiny_models (a DIR holding anything it did not write is refused before
    any work; nothing is created beside it)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    line = cli.one_line_error(cli.invoke(["dev", "tiny-models", out]))
    assert f"DIR {out} is not empty" in line and "pass a new or empty folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"


def test_a_seed_bound_is_said_in_full_in_the_refusal_and_in_help(tmp_path, cli):
    """Guard: isood.core.optspec.format_bound (the refusal said "in [0, 2.14748e+09]", which names no integer to pass)."""
    line = cli.one_line_error(cli.invoke(["dev", "tiny-models", tmp_path / "t", "--seed", "2147483648"]))
    assert "--seed must be an integer in [0, 2147483647], got 2147483648" in line
    assert not (tmp_path / "t").exists()
    shown = " ".join(cli.invoke(["dev", "tiny-models", "--help"]).output.split())
    assert "in [0, 2147483647]" in shown
