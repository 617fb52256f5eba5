"""Controller configuration (k8s.config): precedence, clear errors, one default per setting
(the chart's copies checked against it) and the one path from a setting to the actor that
uses it (k8s.controller.binder_config, lease_config)."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from actors.coordinator_protocol import GetStatus
from actors.errors import TransientWriteError
from fakes.memory_store import MemoryStore
from k8s.config import Config, default, field_help, load
from k8s.controller import binder_config, lease_config, tenant_gate
from k8s.leader import LeaseConfig
from supervisor.binder import BinderConfig
from tests.support.binder import running_binder
from tests.timing import FAKE_TIME, eventually

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-binder"
H100 = "nvidia.com/H100"

BINDER_SETTINGS = {  # operator setting -> (part of BinderConfig, its field)
    "ask_timeout": ("coordinator", "ask_timeout"),
    "resync_interval": ("coordinator", "resync_interval"),
    "write_timeout": ("pipeline", "write_timeout"),
    "write_attempts": ("pipeline", "retry_attempts"),
    "settle_timeout": ("pipeline", "settle_timeout"),
    "prepare_ttl": ("node", "prepare_ttl"),
    "commit_ttl": ("node", "commit_ttl"),
    "max_restarts": ("supervisor", "max_restarts"),
    "max_restart_seconds": ("supervisor", "max_seconds"),
    "defrag_interval": ("coordinator", "defrag_interval"),
    "defrag_max_moves": ("coordinator", "defrag_max_moves"),
}


def test_flags_beat_environment_beat_file(tmp_path):
    f = tmp_path / "settings.yaml"
    f.write_text("bind-timeout: 11\nattachment_grace: 90\nraw-resource-names: denied\n")
    cfg = load(str(f), env={"GPU_BINDER_BIND_TIMEOUT": "12", "GPU_BINDER_WEBHOOK_PORT": "0"},
               flags={"bind_timeout": "13"})
    assert (cfg.bind_timeout, cfg.attachment_grace, cfg.raw_resource_names, cfg.webhook_port) \
        == (13.0, 90.0, "denied", 0)


@pytest.mark.parametrize("flags, message", [
    ({"raw_resource_names": "maybe"}, "--raw-resource-names: must be 'allowed' or 'denied'"),
    ({"bind_timeout": "soon"}, "--bind-timeout: not a number: 'soon'"),
    ({"bind_timeout": "200"}, "--bind-timeout: must be at most 21 s"),
    ({"bind_timeout": "20", "attachment_grace": "15"},
     "--bind-timeout: must be shorter than --attachment-grace"),
    ({"renew_deadline": "20"},
     "--lease-duration > --renew-deadline > --retry-period is required, got 10.0 > 20.0 > 1.0"),
    ({"kubeconfig": "/no/such/file"}, "--kubeconfig: no such file '/no/such/file'"),
    ({"webhook_port": "9443"}, "--webhook-cert and --webhook-key are required"),
    ({"metrics_port": "70000"}, "--metrics-port: must be a TCP port 0-65535"),
    ({"write_attempts": "0"}, "--write-attempts: must be at least 1, got 0"),
    ({"max_restarts": "-1"}, "--max-restarts: must be at least 0, got -1"),
    ({"commit_ttl": "0"}, "--commit-ttl: must be > 0 seconds, got 0.0"),
    ({"prepare_ttl": "5"}, "--prepare-ttl: must be longer than --ask-timeout"),
    ({"defrag_interval": "-1"}, "--defrag-interval: must be >= 0 seconds (0: off), got -1.0"),
    ({"malloc_trim_period": "-1"}, "--malloc-trim-period: must be >= 0 seconds (0: off), got -1.0"),
    ({"defrag_max_moves": "0"}, "--defrag-max-moves: must be at least 1, got 0"),
    ({"webhook_tenant_concurrency": "0"}, "--webhook-tenant-concurrency: must be at least 1"),
    ({"webhook_tenant_concurrency": "9", "webhook_concurrency": "8"},
     "--webhook-tenant-concurrency: must be at least 1 and at most --webhook-concurrency (8)"),
    ({"webhook_tenant_queue": "-1"}, "--webhook-tenant-queue: must be at least 0, got -1"),
    ({"webhook_tenant_wait": "20"}, "--webhook-tenant-wait: must be shorter than --bind-timeout"),
    ({"webhook_tenant_wait": "-1"}, "--webhook-tenant-wait: must be >= 0 seconds"),
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


@pytest.mark.parametrize("text, problem", [
    ("a: [b", "expected ',' or ']', but got '<stream end>' (line 1, column 6)"),
    ("a: b: c\n", "mapping values are not allowed here (line 1, column 5)"),
])
def test_a_config_file_that_is_not_YAML_is_refused_in_one_line_saying_where(tmp_path, text,
                                                                           problem):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError) as err:
        load(str(bad), env={})
    assert str(err.value) == f"{bad}: not valid YAML: {problem}"


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ValueError, match="environment: GPU_BINDER_BIND_TIMEOUT: not a number"):
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


# -- one default per setting, one path to the actors ---------------------------------------


def test_the_binder_settings_default_to_the_binders_own_defaults_and_reach_its_config():
    defaults = BinderConfig()
    for name, (part, knob) in BINDER_SETTINGS.items():
        assert default(name) == getattr(getattr(defaults, part), knob), name
        assert f"(default: {default(name):g})" in field_help(name)
    assert binder_config(load(None, env={}, flags={"webhook_port": "0"})) == defaults
    changed = {name: default(name) * 2 + 1 for name in BINDER_SETTINGS}
    got = binder_config(load(None, env={}, flags={"webhook_port": "0", **changed}))
    assert {name: getattr(getattr(got, part), knob)
            for name, (part, knob) in BINDER_SETTINGS.items()} == changed
    # nothing else moved
    untouched = replace(got, **{part: getattr(defaults, part) for part, _ in
                                BINDER_SETTINGS.values()})
    assert untouched == defaults


def test_the_fair_share_settings_reach_the_webhooks_gate():
    cfg = load(None, env={"GPU_BINDER_WEBHOOK_TENANT_QUEUE": "3"},
               flags={"webhook_port": "0", "webhook_concurrency": "10",
                      "webhook_tenant_concurrency": "2", "webhook_tenant_wait": "1.5"})
    gate = tenant_gate(cfg)
    assert (gate.capacity, gate.per_tenant, gate.queue, gate.max_wait) == (10, 2, 3, 1.5)


def test_lease_settings_reach_the_lease_loop():
    cfg = load(None, env={"GPU_BINDER_LEASE_NAME": "gb"},
               flags={"webhook_port": "0", "lease_namespace": "ops", "lease_duration": "30",
                      "renew_deadline": "20", "retry_period": "4"})
    assert lease_config(cfg) == LeaseConfig(namespace="ops", name="gb", lease_duration=30.0,
                                            renew_deadline=20.0, retry_period=4.0)


@pytest.fixture
def anyio_backend():
    return FAKE_TIME  # the binder's retries and deadlines on fake time


@pytest.mark.anyio
async def test_a_retry_count_set_in_the_config_file_is_the_one_the_status_pipeline_uses(
        tmp_path):
    """--write-attempts from the operator's file: a request whose writes always fail is
    tried exactly that often before its writes give up (the default would try 6 times)."""
    f = tmp_path / "config.yaml"
    f.write_text("write_attempts: 2\n")
    cfg = load(str(f), env={"GPU_BINDER_WEBHOOK_PORT": "0"})
    assert default("write_attempts") != 2
    s = MemoryStore()
    s.add_namespace("t")
    s.add_class("h100", H100)
    s.add_node("n1", {H100: 1})
    s.add_device("t", "a", "h100")
    s.fail_next(TransientWriteError, op="answer", times=1000)
    async with running_binder(s, binder_config(cfg)) as binder:
        s.request("t", "vm", ["a"])

        async def gave_up() -> bool:
            return (await binder.coordinator.ask(GetStatus())).gave_up >= 1
        await eventually(gave_up, what="the request's writes gave up")
        # read at once: the request is examined again only after stalled_delay (1 s)
        assert s.writes_attempted == 2


def _snake(key: str) -> str:
    """Helm's `snakecase` of a settings key, as the chart's config template applies it."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()


def test_the_charts_settings_are_controller_settings_with_the_controllers_defaults():
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)["settings"]
    assert values and all(value == default(_snake(key)) for key, value in values.items()), values
    # the settings shown commented out (unset: the controller's defaults) show those defaults
    shown = dict(re.findall(r"(?m)^  # (\w+): ([\d.]+)\b", text))
    assert len(shown) >= 9
    assert {k: float(v) for k, v in shown.items()} == {k: default(_snake(k)) for k in shown}
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    keys = schema["properties"]["settings"]["properties"]
    assert set(values) <= set(keys)
    assert {_snake(k) for k in keys} <= set(Config.__dataclass_fields__)
    # the template's fallbacks for unset values (its cross checks) are the same defaults
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    fallbacks = re.findall(r"\$s\.(\w+) \| default ([\d.]+)", helpers)
    assert len(fallbacks) >= 4
    assert {k: float(v) for k, v in fallbacks} == {k: default(_snake(k)) for k, _ in fallbacks}


def test_a_range_error_names_where_the_bad_value_came_from(tmp_path):
    """A setting out of range from the environment or the file names the variable or the
    key as well as the flag; one from a flag names the flag only."""
    with pytest.raises(ValueError, match=r"^--bind-timeout: must be > 0 seconds, got -1\.0 "
                                         r"\(--bind-timeout is environment variable "
                                         r"GPU_BINDER_BIND_TIMEOUT\)$"):
        load(env={"GPU_BINDER_BIND_TIMEOUT": "-1"})
    path = tmp_path / "config.yaml"
    path.write_text("webhook-tenant-queue: -2\n")
    with pytest.raises(ValueError, match=r"\(--webhook-tenant-queue is key "
                                         r"'webhook-tenant-queue' of .*config\.yaml\)$"):
        load(file=str(path), env={})
    with pytest.raises(ValueError, match=r"^--bind-timeout: must be > 0 seconds, got -1\.0$"):
        load(env={"GPU_BINDER_BIND_TIMEOUT": "5"}, flags={"bind_timeout": -1})


def test_the_preemption_settings_reach_the_coordinator():
    """P2's preemption.minRuntime and P4's preemption.nominationTTL (seconds), defaults 10m and 2m."""
    from datetime import timedelta
    assert (default("preemption_min_runtime"), default("preemption_nomination_ttl")) == (600.0, 120.0)
    got = binder_config(load(None, env={}, flags={"webhook_port": "0", "preemption_min_runtime": "0",
                                                  "preemption_nomination_ttl": "45"}))
    assert got.coordinator.preemption.preemption.min_runtime == timedelta(0)
    assert got.coordinator.preemption.ttl == timedelta(seconds=45)
    with pytest.raises(ValueError, match="--preemption-nomination-ttl: must be > 0 seconds"):
        load(None, env={}, flags={"webhook_port": "0", "preemption_nomination_ttl": "0"})
    with pytest.raises(ValueError, match="--preemption-min-runtime: must be >= 0 seconds"):
        load(None, env={}, flags={"webhook_port": "0", "preemption_min_runtime": "-1"})


def test_P5_line_reserve_after_reaches_the_coordinator_and_a_bad_value_is_one_clear_line():
    """`line.reserveAfter` (seconds, default 5m): --line-reserve-after, GPU_BINDER_LINE_RESERVE_AFTER
    or the file's key; negative or not a number is refused naming the flag."""
    from datetime import timedelta
    assert default("line_reserve_after") == 300.0
    assert "line.reserveAfter" in field_help("line_reserve_after") and "(default: 300)" in field_help(
        "line_reserve_after")
    got = binder_config(load(None, env={}, flags={"webhook_port": "0", "line_reserve_after": "90"}))
    assert got.coordinator.line.reserve_after == timedelta(seconds=90)
    assert got.coordinator.line.retry_grace == timedelta(seconds=10)              # the rest as it was
    assert binder_config(load(None, env={"GPU_BINDER_LINE_RESERVE_AFTER": "0"}, flags={"webhook_port": "0"})
                         ).coordinator.line.reserve_after == timedelta(0)
    with pytest.raises(ValueError, match=r"^--line-reserve-after: must be >= 0 seconds, got -1\.0$"):
        load(None, env={}, flags={"webhook_port": "0", "line_reserve_after": "-1"})
    with pytest.raises(ValueError, match=r"^--line-reserve-after: not a number: 'soon'$"):
        load(None, env={}, flags={"webhook_port": "0", "line_reserve_after": "soon"})


def test_P5_line_max_per_namespace_reaches_the_coordinator_and_a_bad_value_is_one_clear_line():
    """`line.maxPerNamespace` (default 100): --line-max-per-namespace,
    GPU_BINDER_LINE_MAX_PER_NAMESPACE or the file's key; below 1 or not a whole number is
    refused naming the flag."""
    assert default("line_max_per_namespace") == 100
    assert "line.maxPerNamespace" in field_help("line_max_per_namespace")
    assert "(default: 100)" in field_help("line_max_per_namespace")
    got = binder_config(load(None, env={}, flags={"webhook_port": "0", "line_max_per_namespace": "7"}))
    assert got.coordinator.line.per_namespace == 7
    assert binder_config(load(None, env={"GPU_BINDER_LINE_MAX_PER_NAMESPACE": "3"}, flags={"webhook_port": "0"})
                         ).coordinator.line.per_namespace == 3
    with pytest.raises(ValueError, match=r"^--line-max-per-namespace: must be at least 1, got 0$"):
        load(None, env={}, flags={"webhook_port": "0", "line_max_per_namespace": "0"})
    with pytest.raises(ValueError, match=r"^--line-max-per-namespace: not a whole number: 'many'$"):
        load(None, env={}, flags={"webhook_port": "0", "line_max_per_namespace": "many"})


def test_P5_bare_vmis_refused_at_W1_enter_the_line_unless_turned_off():
    """`--line-bare-vmis` (default true): a bare VMI refused for room waits in the line,
    answered 503 with Retry-After, its place kept only while its client retries
    (`--line-retry-grace`); an operator may turn it off (docs/contract.md §3c P5)."""
    assert default("line_bare_vmis") is True
    assert "(default: true)" in field_help("line_bare_vmis")
    assert load(None, env={}, flags={"webhook_port": "0", "line_bare_vmis": "false"}).line_bare_vmis is False
    assert load(None, env={"GPU_BINDER_LINE_BARE_VMIS": "no"}, flags={"webhook_port": "0"}).line_bare_vmis is False
    assert load(None, env={}, flags={"webhook_port": "0"}).line_bare_vmis is True


def test_P5_the_line_can_be_turned_off_and_the_switch_reaches_the_coordinator():
    """`--line-enabled` (default true; `line.enabled`, docs/contract.md §3c P5): false keeps
    no line (the coordinator's `LineSettings.enabled`), the rest of the line's settings as
    they were; a typo is refused naming the flag."""
    assert default("line_enabled") is True
    assert "(default: true)" in field_help("line_enabled") and "line.enabled" in field_help("line_enabled")
    assert binder_config(load(None, env={}, flags={"webhook_port": "0"})).coordinator.line.enabled is True
    off = load(None, env={}, flags={"webhook_port": "0", "line_enabled": "false"})
    assert off.line_enabled is False and off.line_bare_vmis is True
    got = binder_config(off).coordinator.line
    assert got.enabled is False and got.per_namespace == default("line_max_per_namespace")
    assert load(None, env={"GPU_BINDER_LINE_ENABLED": "off"}, flags={"webhook_port": "0"}).line_enabled is False
    with pytest.raises(ValueError, match=r"^--line-enabled: not true or false: 'maybe'$"):
        load(None, env={}, flags={"webhook_port": "0", "line_enabled": "maybe"})


def test_P5_line_retry_grace_reaches_the_coordinator_and_a_bad_value_is_one_clear_line():
    """`line.retryGrace` (default 10 s: five Retry-After periods of 2 s): --line-retry-grace,
    GPU_BINDER_LINE_RETRY_GRACE or the file's key; below one Retry-After is refused naming
    the flag."""
    from datetime import timedelta
    assert default("line_retry_grace") == 10.0
    assert "line.retryGrace" in field_help("line_retry_grace") and "(default: 10)" in field_help(
        "line_retry_grace")
    got = binder_config(load(None, env={}, flags={"webhook_port": "0", "line_retry_grace": "30"}))
    assert got.coordinator.line.retry_grace == timedelta(seconds=30)
    assert got.coordinator.line.reserve_after == timedelta(minutes=5)              # the rest as it was
    assert binder_config(load(None, env={"GPU_BINDER_LINE_RETRY_GRACE": "4"}, flags={"webhook_port": "0"})
                         ).coordinator.line.retry_grace == timedelta(seconds=4)
    with pytest.raises(ValueError, match=r"^--line-retry-grace: must be >= 2 seconds \(one Retry-After\), got 1\.0$"):
        load(None, env={}, flags={"webhook_port": "0", "line_retry_grace": "1"})
    with pytest.raises(ValueError, match=r"^--line-retry-grace: not a number: 'soon'$"):
        load(None, env={}, flags={"webhook_port": "0", "line_retry_grace": "soon"})


def test_a_switch_takes_true_or_false_and_refuses_anything_else():
    """A typo must not turn a switch off (`--leader-election=of` would have run no binder)."""
    for text, want in (("true", True), ("Yes", True), ("on", True), ("1", True),
                       ("false", False), ("NO", False), ("off", False), ("0", False)):
        assert load(None, env={}, flags={"webhook_port": "0", "line_bare_vmis": text}).line_bare_vmis is want
    with pytest.raises(ValueError, match=r"^--line-bare-vmis: not true or false: 'maybe'$"):
        load(None, env={}, flags={"webhook_port": "0", "line_bare_vmis": "maybe"})
    with pytest.raises(ValueError, match=r"^environment: GPU_BINDER_LEADER_ELECTION: not true or false: 'of'$"):
        load(None, env={"GPU_BINDER_LEADER_ELECTION": "of"}, flags={"webhook_port": "0"})


def test_a_config_file_that_cannot_be_read_names_the_flag(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ValueError, match=r"^--config .*nope\.yaml: cannot be read: No such file or directory$"):
        load(file=str(missing), env={})


@pytest.mark.parametrize("name", ["line_retry_grace", "attachment_grace", "bind_timeout",
                                  "preemption_min_runtime", "preemption_nomination_ttl",
                                  "line_reserve_after", "health_window", "defrag_interval",
                                  "malloc_trim_period"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e300"])
def test_a_duration_that_is_not_a_finite_number_of_seconds_is_one_clear_line(name, value):
    """Bad input found by a newcomer: `inf` and `1e300` passed the range checks and crashed
    the controller with a traceback (OverflowError making a timedelta), `nan` slipped past
    every `<= 0` check (`--bind-timeout=nan` ran). Every duration setting must be finite and
    at most MAX_SECONDS, refused naming its flag, from a flag or the environment."""
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=rf"^{flag}: must be a finite number of seconds of at most 1e\+09, got "):
        load(None, env={}, flags={"webhook_port": "0", name: value})
    with pytest.raises(ValueError, match=rf"^{flag}: must be a finite number .* \({flag} is environment "
                                         rf"variable GPU_BINDER_{name.upper()}\)$"):
        load(None, env={f"GPU_BINDER_{name.upper()}": value}, flags={"webhook_port": "0"})
