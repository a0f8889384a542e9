"""The smallest complete Flotilla provider plugin in Python. Copy this directory to start yours.

It drives a simple REST API (the "example cloud", documented in README.md) over wasi:http,
through the blocking helper in `flotilla_http.py`. Every request names the pool's credential in
the `flotilla-credential` header; the host strips that header and adds the real authorisation,
so this code never sees a secret. Scaling policy lives in the host: this plugin only translates
calls.

Binding convention (componentize-py): an export returns its `ok` value and raises
`Err(<error case>)` for a contract error, e.g. `raise Err(Error_NotFound("instance i-1"))`.
Any other exception is turned into `other(<traceback>)` by `@contract` below, instead of a trap.
"""

import functools
import json
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NoReturn, Optional, TypeVar
from urllib.parse import quote, urlsplit

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log
from wit_world.imports.flotilla_provider_types import (
    Arch, Capabilities, Connection, Error, Error_InvalidConfig, Error_NotFound, Error_Other,
    Error_Throttled, Error_Transient, Error_Unauthorized, Error_Unsupported, Instance,
    InstanceState, InstanceState_Creating, InstanceState_Deleted, InstanceState_Deleting,
    InstanceState_Failed, InstanceState_Running, Os, Protocol, ProviderInfo, Throttle,
)

import flotilla_http
from flotilla_http import HttpError

# `flotilla plugin new NAME` replaces this name with yours.
NAME = "flotilla-plugin-template-python"
VERSION = "0.1.0"
# Longest traceback or response excerpt put into an error message.
_EXCERPT = 2000
_U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Settings:
    """The pool's `plugin_config`."""

    endpoint: str  # Base URL of the API; it must be in the pool's allow-list.
    group: str  # The group to manage.
    credential: Optional[str]  # Name of the pool credential the host applies to each request.


_KEYS = ("endpoint", "group", "credential")
# Rebuilt by `init` in every fresh instance: the host never calls anything else before it.
_settings: Optional[Settings] = None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _string(raw: Dict[str, Any], key: str, problems: List[str], required: bool) -> Optional[str]:
    value = raw.get(key)
    if value is None:
        if required:
            problems.append(f"{key}: missing")
        return None
    if not isinstance(value, str):
        problems.append(f"{key}: must be a string, not {_json_type(value)}")
        return None
    return value


def parse_settings(text: str) -> Settings:
    """Validates the settings, raising one `invalid-config` that lists every problem."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise Err(Error_InvalidConfig(f"settings are not valid JSON: {e}")) from None
    if not isinstance(raw, dict):
        raise Err(Error_InvalidConfig(f"settings must be an object, not {_json_type(raw)}"))
    problems = [f"{key}: unknown key (expected one of {', '.join(_KEYS)})"
                for key in sorted(set(raw) - set(_KEYS))]
    endpoint = _string(raw, "endpoint", problems, required=True)
    if endpoint is not None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            problems.append("endpoint: must be an http(s) URL such as https://api.example.com")
        elif parts.query or parts.fragment:
            problems.append("endpoint: must not have a query or fragment")
    group = _string(raw, "group", problems, required=True)
    if group is not None and (not group or group != group.strip() or not group.isprintable()
                              or any(c in group for c in "/?#%")):
        problems.append("group: must be a non-empty name without '/', '?', '#', '%' or spaces")
    credential = _string(raw, "credential", problems, required=False)
    if credential is not None and (not credential or not credential.isprintable()):
        problems.append("credential: must be a non-empty name of a pool credential")
    if problems:
        raise Err(Error_InvalidConfig("; ".join(problems)))
    return Settings(endpoint.rstrip("/"), group, credential)


def _settings_or_fail() -> Settings:
    if _settings is None:
        raise Err(Error_Other("init has not been called"))
    return _settings


def status_error(action: str, response: flotilla_http.Response) -> Error:
    """Maps an unsuccessful HTTP status to the contract's error cases."""
    status = response.status
    excerpt = response.body[:300].decode("utf-8", "replace")
    message = f"{action}: HTTP {status}: {excerpt}"
    if status in (401, 403):
        return Error_Unauthorized(message)
    if status == 404:
        return Error_NotFound(message)
    if status == 429:
        retry = (response.header("retry-after") or "").strip()
        # Retry-After may also be an HTTP date; 0 then means "use your own backoff".
        seconds = min(int(retry), _U32_MAX) if retry.isdigit() else 0
        return Error_Throttled(Throttle(retry_after_seconds=seconds, message=message))
    if status in (400, 422):
        return Error_InvalidConfig(message)
    if 500 <= status <= 599:
        return Error_Transient(message)
    return Error_Other(message)


def call(action: str, method: str, path: str, body: Any = None) -> Any:
    """Sends one JSON request, authenticated by the host, and decodes the JSON answer."""
    s = _settings_or_fail()
    url = f"{s.endpoint}/v1/groups/{s.group}{path}"
    headers = [("accept", "application/json")]
    if s.credential is not None:
        # The host replaces this with real authorisation; the secret never reaches us.
        headers.append(("flotilla-credential", s.credential))
    data = None
    if body is not None:
        headers.append(("content-type", "application/json"))
        data = json.dumps(body).encode()
    try:
        response = flotilla_http.request(method, url, headers, data)
    except HttpError as e:
        hint = (" (the host refused it: is the endpoint in allowed_outbound_hosts, and the "
                "credential bound to it?)" if isinstance(e.code, _DENIED) else "")
        raise Err(Error_Transient(f"{action}: {url}: {e}{hint}")) from None
    if not 200 <= response.status <= 299:
        raise Err(status_error(action, response))
    try:
        return json.loads(response.body)
    except ValueError as e:
        raise Err(Error_Other(f"{action}: unexpected response: {e}")) from None


_DENIED = flotilla_http.http.ErrorCode_HttpRequestDenied


def _unexpected(action: str, what: str) -> NoReturn:
    raise Err(Error_Other(f"{action}: unexpected response: {what}"))


def _field(action: str, obj: Any, key: str, kind: type) -> Any:
    """`obj[key]` if obj is an object holding a `kind` there; otherwise an `other` error."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        _unexpected(action, f"{key!r} is not {_json_type(kind())}")
    return value


def map_state(state: str) -> InstanceState:
    if state in ("pending", "provisioning"):
        return InstanceState_Creating()
    if state == "running":
        return InstanceState_Running()
    if state in ("stopping", "terminating"):
        return InstanceState_Deleting()
    if state == "terminated":
        return InstanceState_Deleted()
    return InstanceState_Failed(f"cloud state {state!r}")


F = TypeVar("F", bound=Callable[..., Any])


def contract(method: F) -> F:
    """Lets contract errors (`Err`) through and turns any other exception into `other(...)`.

    Without this, componentize-py traps on an unexpected exception; the host would then discard
    the instance and report only "trap", without the Python traceback.
    """

    @functools.wraps(method)
    def wrapper(*args: Any) -> Any:
        try:
            return method(*args)
        except Err:
            raise
        except Exception:
            text = traceback.format_exc()
            raise Err(Error_Other(f"unexpected exception in {method.__name__}: "
                                  f"{text[-_EXCERPT:]}")) from None

    return wrapper  # type: ignore[return-value]


class InstanceGroup(exports.InstanceGroup):
    """The `instance-group` export: componentize-py looks this class up by name."""

    @contract
    def init(self, settings: str) -> ProviderInfo:
        global _settings
        s = parse_settings(settings)
        _settings = s
        group = call("GetGroup", "GET", "")
        max_size = _field("GetGroup", group, "max_size", int)
        log.emit(log.Level.INFO,
                 f"{NAME} {VERSION} managing example/{s.group} (max size {max_size})")
        return ProviderInfo(
            id=f"example/{s.group}",
            version=VERSION,
            max_size=max(0, min(max_size, _U32_MAX)),
            capabilities=Capabilities(heartbeat=False, expiring_connect_info=False),
        )

    @contract
    def update(self) -> List[Instance]:
        answer = call("ListInstances", "GET", "/instances")
        # Each id at most once: a duplicate would make the host discard the whole list.
        states: Dict[str, InstanceState] = {}
        for item in _field("ListInstances", answer, "instances", list):
            states[_field("ListInstances", item, "id", str)] = map_state(
                _field("ListInstances", item, "state", str))
        return [Instance(id=i, state=state) for i, state in states.items()]

    @contract
    def increase(self, delta: int) -> int:
        if delta == 0:
            return 0
        answer = call("Increase", "POST", "/increase", {"delta": delta})
        requested = _field("Increase", answer, "requested", int)
        # Never report more than asked (a contract violation) nor a negative count.
        return max(0, min(requested, delta))

    @contract
    def decrease(self, ids: List[str]) -> List[str]:
        if not ids:
            return []
        try:
            answer = call("Decrease", "POST", "/decrease", {"ids": ids})
            accepted = set(_field("Decrease", answer, "accepted", list))
        except Err as e:
            # A 404 may mean "none of these ids exist": the listing below tells that apart
            # from a missing group (then it raises not-found itself).
            if not isinstance(e.value, Error_NotFound):
                raise
            accepted = set()
        if not set(ids) <= accepted:
            # Idempotent: an id the cloud no longer has, or is already removing, counts as
            # accepted, whether or not the cloud said so.
            listed = {i.id: i.state for i in self.update()}
            removing = (InstanceState_Deleting, InstanceState_Deleted)
            accepted |= {i for i in ids
                         if isinstance(listed.get(i, InstanceState_Deleted()), removing)}
        # Only ids that were asked for, each once, in the order asked.
        return list(dict.fromkeys(i for i in ids if i in accepted))

    @contract
    def connect_info(self, id: str) -> Connection:
        answer = call("GetInstance", "GET", f"/instances/{quote(id, safe='')}")
        address = answer.get("address") if isinstance(answer, dict) else None
        zone = answer.get("zone") if isinstance(answer, dict) else None
        return Connection(
            id=id,
            os=Os.LINUX,
            arch=Arch.AMD64,
            protocol=Protocol.SSH,
            internal_address=address if isinstance(address, str) else None,
            external_address=None,
            port=22,
            username="ci",
            expires=None,
            zone=zone if isinstance(zone, str) else None,
        )

    @contract
    def heartbeat(self, id: str) -> None:
        raise Err(Error_Unsupported("heartbeat"))

    @contract
    def shutdown(self) -> None:
        return None
