"""Controller configuration: precedence and clear errors (k8s.config)."""

import pytest

from k8s.config import load


def test_flags_beat_environment_beat_file(tmp_path):
    f = tmp_path / "settings.yaml"
    f.write_text("bind-timeout: 11\nattachment_grace: 90\nraw-resource-names: denied\n")
    cfg = load(str(f), env={"GPU_BINDER_BIND_TIMEOUT": "12", "GPU_BINDER_WEBHOOK_PORT": "0"},
               flags={"bind_timeout": "13"})
    assert (cfg.bind_timeout, cfg.attachment_grace, cfg.raw_resource_names, cfg.webhook_port) \
        == (13.0, 90.0, "denied", 0)


@pytest.mark.parametrize("flags, message", [
    ({"raw_resource_names": "maybe"}, "--raw-resource-names: must be 'allowed' or 'denied'"),
    ({"bind_timeout": "soon"}, "flags: --bind-timeout: not a float: 'soon'"),
    ({"bind_timeout": "200"}, "--bind-timeout: must be at most 21 s"),
    ({"bind_timeout": "20", "attachment_grace": "15"},
     "--bind-timeout: must be shorter than --attachment-grace"),
    ({"renew_deadline": "20"},
     "--lease-duration > --renew-deadline > --retry-period is required, got 15.0 > 20.0 > 2.0"),
    ({"kubeconfig": "/no/such/file"}, "--kubeconfig: no such file '/no/such/file'"),
    ({"webhook_port": "9443"}, "--webhook-cert and --webhook-key are required"),
    ({"metrics_port": "70000"}, "--metrics-port: must be a TCP port 0-65535"),
])
def test_bad_settings_are_refused_with_the_flag_named(flags, message):
    flags = {"webhook_port": "0", **flags}
    with pytest.raises(ValueError) as err:
        load(None, env={}, flags=flags)
    assert message in str(err.value)


def test_unknown_setting_in_file_is_named(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("bindTimeout: 3\n")
    with pytest.raises(ValueError, match="unknown setting 'bindTimeout'"):
        load(str(f), env={})


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ValueError, match="environment: GPU_BINDER_BIND_TIMEOUT: not a float"):
        load(None, env={"GPU_BINDER_BIND_TIMEOUT": "soon", "GPU_BINDER_WEBHOOK_PORT": "0"})


def test_W6_webhook_without_client_ca_is_refused_unless_explicitly_insecure(tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("x")
    key.write_text("x")
    base = {"webhook_port": "9443", "webhook_cert": str(cert), "webhook_key": str(key)}
    with pytest.raises(ValueError, match="--webhook-client-ca is required when --webhook-port"):
        load(None, env={}, flags=base)
    cfg = load(None, env={"GPU_BINDER_WEBHOOK_INSECURE_SKIP_CLIENT_AUTH": "true"}, flags=base)
    assert (cfg.webhook_client_ca, cfg.webhook_insecure_skip_client_auth) == (None, True)
    cfg = load(None, env={}, flags={**base, "webhook_client_ca": str(cert)})
    assert cfg.webhook_client_ca == str(cert)
    with pytest.raises(ValueError, match="contradict"):
        load(None, env={}, flags={**base, "webhook_client_ca": str(cert),
                                  "webhook_insecure_skip_client_auth": "true"})
    with pytest.raises(ValueError, match="--webhook-client-ca: no such file"):
        load(None, env={}, flags={**base, "webhook_client_ca": str(tmp_path / "nope")})
