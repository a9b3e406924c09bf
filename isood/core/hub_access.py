"""Loading a model by its Hugging Face Hub name: fail in about a second, in one line, when the Hub is out of reach.

huggingface_hub retries a failed request five times, pausing 1, 2, 4, 8 and 8 s, and the model libraries ask for
more than one file, so without a network a Hub name took most of a minute to fail (measured on a machine whose DNS
answers "no such host" at once: ``--clip ViT-B-32:openai`` 64 s, ``--model resnet50`` 56 s, ``--pipeline
stabilityai/sdxl-turbo`` 37 s). huggingface_hub's own switch, ``HF_HUB_OFFLINE=1``, makes every request fail at
once; files already in the local cache still load.

``hub_access()`` looks once per process: with ``HF_HUB_OFFLINE`` set nothing is probed; otherwise one HEAD request
to the Hub's endpoint (``huggingface_hub.constants.ENDPOINT``, i.e. ``$HF_ENDPOINT`` or huggingface.co; proxies from
the environment) answers within ``HUB_PROBE_SECONDS``, name lookup included. Any HTTP answer counts as reachable.
``hub_guard(access)`` puts huggingface_hub in offline mode while a model loads when the probe found the Hub
unreachable, so a cached model loads at once and a missing one fails at once; ``access.missing(...)`` is the one
line that says why and what to pass instead, naming ``HF_HUB_OFFLINE``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

from isood.core.errors import one_line

__all__ = ["HUB_PROBE_SECONDS", "OFFLINE_VAR", "TINY_HINT", "HubAccess", "hub_access", "hub_guard", "offline_set"]

#: How long the reachability probe of the Hub waits (name lookup, connection and answer together).
HUB_PROBE_SECONDS = 3.0
#: huggingface_hub's offline switch (``TRANSFORMERS_OFFLINE`` is its older spelling).
OFFLINE_VAR = "HF_HUB_OFFLINE"
#: Where a newcomer gets local models that need nothing from the Hub (said by the one-line errors).
TINY_HINT = "e.g. written by `isood dev tiny-models DIR`"


def offline_set() -> bool:
    """Whether the environment puts huggingface_hub in offline mode (its own rule: ``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE`` set to 1 / true / yes / on)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in (OFFLINE_VAR, "TRANSFORMERS_OFFLINE"))


@dataclass(frozen=True)
class HubAccess:
    """Whether a Hub download can work: ``offline`` (``HF_HUB_OFFLINE`` is set) or ``unreachable`` (why the probe
    of ``endpoint`` failed; None when it answered or was not probed)."""

    endpoint: str
    offline: bool
    unreachable: str | None = None

    @property
    def usable(self) -> bool:
        return not self.offline and self.unreachable is None

    def missing(self, what: str, instead: str, error: BaseException | None = None) -> str:
        """The one line of a model that could not be loaded by its Hub name: ``what`` (e.g. "--clip
        ViT-B-32:openai"), why, and ``instead`` (e.g. "pass --clip local-dir:PATH (...)")."""
        if self.offline:
            return (f"{what}: not in the local Hugging Face cache, and {OFFLINE_VAR}=1 forbids downloading: "
                    f"{instead}, or unset {OFFLINE_VAR} where there is internet")
        if self.unreachable is not None:
            return (f"{what}: not in the local Hugging Face cache, and the Hub cannot be reached "
                    f"({self.unreachable}): {instead}, or download it where there is internet; offline, set "
                    f"{OFFLINE_VAR}=1")
        reason = f" ({one_line(error, 160)})" if error is not None else ""
        return f"{what}: could not be loaded{reason}: {instead}"


def _probe(url: str, timeout: float) -> str | None:
    """None when ``url`` gives any HTTP answer within ``timeout`` seconds, else why not (one line). The request
    runs in a daemon thread, so a name lookup that hangs (it ignores socket timeouts) is bounded too."""
    result: list[str | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:  # an answer: the Hub is there
            result.append(None)
        except urllib.error.URLError as e:
            result.append(one_line(str(e.reason), 120))
        except Exception as e:  # noqa: BLE001 -- socket.timeout, ssl errors, ...: not reachable, say why
            result.append(one_line(e, 120) or type(e).__name__)

    thread = threading.Thread(target=ask, name="isood-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    host = urlsplit(url).netloc or url
    if not result:
        return f"{host}: no answer within {timeout:g} s"
    return None if result[0] is None else f"{host}: {result[0]}"


@functools.lru_cache(maxsize=None)
def _access(endpoint: str, offline: bool, timeout: float) -> HubAccess:
    return HubAccess(endpoint, offline, None if offline else _probe(endpoint, timeout))


def hub_access(timeout: float = HUB_PROBE_SECONDS) -> HubAccess:
    """Whether the Hub can be used now (module docstring); probed once per process and endpoint."""
    from huggingface_hub import constants

    return _access(constants.ENDPOINT, offline_set(), float(timeout))


@contextlib.contextmanager
def hub_guard(access: HubAccess) -> Iterator[HubAccess]:
    """While the Hub is unreachable (and ``HF_HUB_OFFLINE`` unset), huggingface_hub runs in offline mode inside
    the block (its ``constants.HF_HUB_OFFLINE``, read on every request; restored afterwards): cached files load at
    once and missing ones fail at once, instead of after its retries."""
    if access.unreachable is None:
        yield access
        return
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield access
    finally:
        constants.HF_HUB_OFFLINE = saved
