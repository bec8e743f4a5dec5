"""The learner reads the same Temporal profile as the TypeScript side (temporal.toml, TEMPORAL_* over it), and
reaches a server behind TLS with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from halo_learner.connection import learner_runtime, metrics_address, temporal_settings
from tls_proxy import SERVER_NAME, TlsProxy, make_chain


def write_toml(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_profile_with_tls_reaches_the_connect_config(tmp_path):
    (tmp_path / "client.pem").write_bytes(b"CERT")
    (tmp_path / "client.key").write_bytes(b"KEY")
    (tmp_path / "ca.pem").write_bytes(b"CA")
    toml = write_toml(
        tmp_path / "temporal.toml",
        [
            "[profile.default]",
            'address = "temporal.internal:7233"',
            'namespace = "halo"',
            "",
            "[profile.mtls]",
            'address = "mtls.example:7233"',
            'namespace = "rl"',
            "[profile.mtls.tls]",
            f'client_cert_path = "{tmp_path / "client.pem"}"',
            f'client_key_path = "{tmp_path / "client.key"}"',
            f'server_ca_cert_path = "{tmp_path / "ca.pem"}"',
            'server_name = "temporal.example"',
            "[profile.mtls.grpc_meta]",
            'x-team = "rl"',
            "",
            "[profile.cloud]",
            'address = "halo.acct.tmprl.cloud:7233"',
            'namespace = "halo.acct"',
            'api_key = "secret"',
        ],
    )
    plain = temporal_settings({"TEMPORAL_CONFIG_FILE": str(toml)})
    assert plain == {"target_host": "temporal.internal:7233", "namespace": "halo"}

    mtls = temporal_settings({"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "mtls"})
    assert mtls["target_host"] == "mtls.example:7233"
    assert mtls["namespace"] == "rl"
    assert mtls["tls"] == TLSConfig(
        client_cert=b"CERT", client_private_key=b"KEY", server_root_ca_cert=b"CA", domain="temporal.example"
    )
    assert mtls["rpc_metadata"] == {"x-team": "rl"}

    cloud = temporal_settings({"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "cloud"})
    assert (cloud["api_key"], cloud["tls"]) == ("secret", True), "an API key implies TLS"

    # Variables win over the profile; a blank one is unset, so the profile's value stays.
    over = temporal_settings(
        {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_ADDRESS": "10.0.0.5:7233", "TEMPORAL_NAMESPACE": ""}
    )
    assert (over["target_host"], over["namespace"]) == ("10.0.0.5:7233", "halo")
    assert temporal_settings({"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_TLS": "yes"})["tls"] == TLSConfig()
    assert "tls" not in temporal_settings({"TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml")})
    assert temporal_settings({"TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml")}) == {
        "target_host": "127.0.0.1:7233",
        "namespace": "default",
    }


def test_bad_connection_settings_are_refused_with_the_variable_named(tmp_path):
    (tmp_path / "client.pem").write_bytes(b"CERT")
    with pytest.raises(ValueError, match="TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH"):
        temporal_settings({"TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "client.pem")})
    with pytest.raises(ValueError, match="TEMPORAL_TLS 'maybe': true or false"):
        temporal_settings({"TEMPORAL_TLS": "maybe"})
    with pytest.raises(ValueError, match="HALO_METRICS_ADDRESS '9467': host:port"):
        metrics_address({"HALO_METRICS_ADDRESS": "9467"})
    assert learner_runtime({}) is None


def test_the_learner_connects_through_tls_from_the_profile(temporal_server, tmp_path):
    chain = make_chain(tmp_path)
    proxy = TlsProxy(temporal_server, chain["cert"], chain["key"])
    try:
        toml = write_toml(
            tmp_path / "temporal.toml",
            [
                "[profile.default]",
                f'address = "{proxy.address}"',
                'namespace = "default"',
                "[profile.default.tls]",
                f'server_ca_cert_path = "{chain["ca"]}"',
                f'server_name = "{SERVER_NAME}"',
            ],
        )

        async def reach(env: dict[str, str]) -> int:
            client = await asyncio.wait_for(Client.connect(**temporal_settings(env)), 20)
            return (await client.count_workflows()).count

        assert asyncio.run(reach({"TEMPORAL_CONFIG_FILE": str(toml)})) >= 0
        assert proxy.handshakes >= 1, "the connection went through the TLS proxy"

        # The certificate is really checked: without the profile's CA, the server's chain is unknown.
        untrusted = write_toml(
            tmp_path / "untrusted.toml",
            [
                "[profile.default]",
                f'address = "{proxy.address}"',
                "[profile.default.tls]",
                f'server_name = "{SERVER_NAME}"',
            ],
        )
        with pytest.raises(Exception, match="(?i)certificate|tls|transport|connect"):
            asyncio.run(reach({"TEMPORAL_CONFIG_FILE": str(untrusted)}))
    finally:
        proxy.close()
