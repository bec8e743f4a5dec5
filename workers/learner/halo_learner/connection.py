"""How the learner reaches Temporal, read the way the TypeScript workers read it (host/connection.ts), so one profile
serves `halo`, the workers, the learner and the `temporal` CLI:

1. the TOML profile TEMPORAL_PROFILE (default `default`) of TEMPORAL_CONFIG_FILE (default
   ~/.config/temporalio/temporal.toml), when that file exists;
2. TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*, TEMPORAL_GRPC_META_* over it;
3. 127.0.0.1:7233 and namespace `default` for what neither gives.

Both sides parse the profile with the SDK's own loader (`temporalio.envconfig` here, `@temporalio/envconfig` there).

With HALO_METRICS_ADDRESS (host:port; `halo up` sets it from HALO_METRICS_PORT) the SDK's runtime serves the
learner's worker metrics there for Prometheus, tagged `halo_worker="learner"` like the TypeScript workers' series.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"

_METRICS_ADDRESS = re.compile(r"^[^\s:]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")


def _overrides(env: Mapping[str, str]) -> dict[str, str]:
    """The environment as envconfig should see it: an empty TEMPORAL_* variable means "not set" (scripts blank
    TEMPORAL_ADDRESS to fall back to the default), except TEMPORAL_GRPC_META_X, whose empty value removes header x;
    TEMPORAL_TLS takes `yes`/`no` and any case, as the TypeScript side does."""
    out: dict[str, str] = {}
    for k, v in env.items():
        if v == "" and k.startswith("TEMPORAL_") and not k.startswith("TEMPORAL_GRPC_META_"):
            continue
        out[k] = v
    tls = out.get("TEMPORAL_TLS")
    if tls is not None:
        if tls.lower() in ("1", "true", "yes"):
            out["TEMPORAL_TLS"] = "true"
        elif tls.lower() in ("0", "false", "no"):
            out["TEMPORAL_TLS"] = "false"
        else:
            raise ValueError(f"TEMPORAL_TLS {tls!r}: true or false")
    return out


def temporal_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """`Client.connect` keyword arguments: target_host, namespace, and api_key, tls and rpc_metadata when the profile
    or the environment set them."""
    profile = ClientConfigProfile.load(override_env_vars=_overrides(env))
    tls = profile.tls
    if tls is not None and bool(tls.client_cert) != bool(tls.client_private_key):
        # envconfig would connect without a client certificate, and the server's refusal would not say why.
        raise ValueError(
            "the TLS client certificate and key (TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH) "
            "must be set together"
        )
    config: dict[str, Any] = dict(profile.to_client_connect_config())
    config["target_host"] = config.get("target_host") or DEFAULT_ADDRESS
    config["namespace"] = config.get("namespace") or DEFAULT_NAMESPACE
    return config


def metrics_address(env: Mapping[str, str]) -> str | None:
    """HALO_METRICS_ADDRESS, checked; None when unset."""
    address = (env.get("HALO_METRICS_ADDRESS") or "").strip()
    if not address:
        return None
    if not _METRICS_ADDRESS.match(address):
        raise ValueError(
            f"HALO_METRICS_ADDRESS {address!r}: host:port to serve worker metrics on (e.g. 127.0.0.1:9467)"
        )
    return address


def learner_runtime(env: Mapping[str, str], name: str = "learner") -> Runtime | None:
    """A runtime serving Prometheus metrics on HALO_METRICS_ADDRESS; None (the SDK's default runtime) without it."""
    address = metrics_address(env)
    if address is None:
        return None
    return Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address), global_tags={"halo_worker": name})
    )
