"""The command line describes itself: every flag of every sub-command of `gpu-binder` and of
the kubectl plugin has a help text with its meaning and default, and bad settings are
refused naming the flag, not the internal setting (cli.main, k8s.config, cli.tools)."""

from __future__ import annotations

import argparse
import logging
import os

import pytest

from bench.registry import BENCHMARKS
from cli.main import build_kubectl_parser, build_parser, kubectl_main, main
from k8s.config import FIELD_HELP, Config, field_help


def _parsers(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _flags():
    for root, prog in ((build_parser(), "gpu-binder"), (build_kubectl_parser(), "kubectl gpu")):
        for path, parser in _parsers(root, prog):
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                       argparse._SubParsersAction)):
                    continue
                yield path, action


ALL = list(_flags())


def test_every_sub_command_is_walked():
    paths = {p for p, _ in ALL}
    for want in ("gpu-binder controller", "gpu-binder webhook", "gpu-binder demo",
                 "gpu-binder cluster up", "gpu-binder explain",
                 "gpu-binder what-if", "gpu-binder top", "kubectl gpu explain",
                 "kubectl gpu what-if", "kubectl gpu top", "gpu-binder defrag",
                 "kubectl gpu defrag", "gpu-binder bench core", "gpu-binder bench e2e",
                 "gpu-binder bench packing", "gpu-binder bench fairness",
                 "gpu-binder bench scale", "gpu-binder bench soak"):
        assert want in paths


@pytest.mark.parametrize("path, action", ALL, ids=[f"{p} {a.dest}" for p, a in ALL])
def test_every_flag_has_help_with_meaning_and_default(path, action):
    text = action.help or ""
    assert len(text) >= 15, f"{path} {action.option_strings or action.dest}: help too short"
    if not action.option_strings:
        return  # a positional: meaning only
    if action.required:
        assert "required" in text
        return
    assert "default" in text, f"{path} {action.option_strings}: help names no default"
    shown = text % {"default": action.default} if "%(default)" in text else text
    if action.default not in (None, False):
        value = f"{action.default:g}" if isinstance(action.default, float) else str(action.default)
        assert value in shown, f"{path} {action.option_strings}: default {value} not shown"


LISTED_AS = {"namespaces": "Namespaces", "deviceclasses": "DeviceClasses", "gpuclasses": "GPUClasses",
             "nodes": "Nodes", "resourceslices": "ResourceSlices", "resourceclaims": "ResourceClaims",
             "devicetaintrules": "DeviceTaintRules", "suspects-configmap": "gpu-suspects",
             "resourcequotas": "ResourceQuotas", "priorityclasses": "PriorityClasses",
             "gpudevices": "GPUDevices", "virtualmachineinstances": "VirtualMachineInstances",
             "pods": "Pods", "kubevirts": "KubeVirt CRs", "settings-configmap": "gpu-settings",
             "gpunominations": "GPUNominations"}
"""How the `--kubeconfig` help names what each informer of the cache lists."""


def _help(path: str, dest: str) -> str:
    return next(a.help for p, a in ALL if p == path and a.dest == dest) % {"default": "D"}


@pytest.mark.parametrize("path", [f"{root} {tool}" for root in ("gpu-binder", "kubectl gpu")
                                  for tool in ("explain", "defrag", "what-if", "top")])
def test_the_read_only_tools_kubeconfig_help_names_everything_they_list(path):
    """`top` and the others read the cluster through `ClusterCache.read_once` (newcomer: the
    help named 5 of its 16 lists): the help names every informer's kind, and a new informer
    must be named here and there."""
    from k8s.cache import ClusterCache

    text = _help(path, "kubeconfig")
    names = [i.name for i in ClusterCache(object()).informers]
    assert set(names) == set(LISTED_AS), "an informer the help does not name yet"
    assert [n for n in names if LISTED_AS[n] not in text] == [], text
    assert "Nothing is written" in text and "(403) stops the command" in text
    assert ("gets that VirtualMachine" in text) == path.endswith("explain")


@pytest.mark.parametrize("root", ["gpu-binder", "kubectl gpu"])
def test_health_kubeconfig_help_names_what_it_reads_and_writes(root):
    """`health` lists DeviceTaintRules and gets the ConfigMap gpu-suspects (cli/health.py
    `_marks`); `clear` deletes the rule or replaces the ConfigMap and creates an Event
    (`_clear`): the help says each, and that nothing else is touched."""
    text = _help(f"{root} health", "kubeconfig")
    for said in ("list DeviceTaintRules", "get the ConfigMap gpu-suspects in --settings-namespace",
                 "deletes that DeviceTaintRule", "updates that ConfigMap",
                 "creates an Event GPUSuspicionCleared", "Nothing else is read or written"):
        assert said in text, (said, text)
    assert "gpu-settings" not in _help(f"{root} health", "settings_namespace")


def test_every_setting_is_documented_with_its_default():
    assert set(FIELD_HELP) == set(Config.__dataclass_fields__)
    assert field_help("bind_timeout").endswith("(default: 20)")
    assert field_help("attachment_grace").endswith("(default: 120)")
    assert field_help("leader_election").endswith("(default: true)")
    assert field_help("webhook_cert").endswith("(default: none)")
    assert "seconds" in field_help("lease_duration")


def test_controller_bad_setting_names_the_flag(capsys):
    assert main(["controller", "--bind-timeout", "30", "--webhook-port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-binder controller: bad configuration: --bind-timeout: "
                          "must be at most 21 s")
    assert main(["webhook", "--lease-duration", "soon"]) == 2
    assert "bad configuration: --lease-duration: not a number: 'soon'" in capsys.readouterr().err


def test_tools_errors_name_the_flag(capsys, tmp_path):
    assert main(["top", "--kubeconfig", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (
        f"gpu-binder top: --kubeconfig: no such file '{tmp_path / 'none'}' (without the flag: "
        f"$KUBECONFIG's first path, else ~/.kube/config)\n")
    assert kubectl_main(["what-if", "cordon", "n1", "--timeout", "0"]) == 2
    assert capsys.readouterr().err == "kubectl gpu what-if: --timeout must be > 0 seconds, got 0\n"


def test_a_closed_api_server_port_is_one_line_naming_host_and_port(capsys, tmp_path):
    """Newcomer's finding: not aiohttp's repr, the host:port and the OS's words."""
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
    assert main(["top", "--kubeconfig", str(kubeconfig), "--timeout", "5"]) == 2
    assert capsys.readouterr().err == (
        f"gpu-binder top: cannot reach the API server of {kubeconfig}: "
        f"127.0.0.1:{port}: connection refused\n")


def test_explain_bad_input_is_refused_before_reading_the_cluster(capsys, tmp_path):
    # the kubeconfig does not exist: the flag error comes first
    assert main(["explain", "--kubeconfig", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == "gpu-binder explain: give either NAMESPACE/NAME or -f FILE\n"
    assert main(["explain", "ns/vm", "--attachment-grace", "-1"]) == 2
    assert capsys.readouterr().err == ("gpu-binder explain: --attachment-grace must be > 0 "
                                       "seconds, got -1\n")
    # a malformed NAMESPACE/NAME or a missing -f file is named before the kubeconfig
    for bad in ("not/a/vmi", "ns/", "/name"):
        assert main(["explain", bad, "--kubeconfig", str(tmp_path / "none")]) == 2
        assert capsys.readouterr().err == ("gpu-binder explain: give the VMI as NAMESPACE/NAME, "
                                           "or a manifest with -f FILE\n")
    assert main(["explain", "-f", str(tmp_path / "no.yaml"), "--kubeconfig", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"gpu-binder explain: -f {tmp_path / 'no.yaml'}: no such file\n"


def test_explain_a_malformed_or_misplaced_manifest_is_refused_before_the_cluster(capsys, tmp_path):
    """-f is parsed before the kubeconfig is read (which here does not exist): a manifest that
    is not YAML, a directory, a NaN timeout, each refused with exit 2 naming what is wrong."""
    none = str(tmp_path / "none")
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: [unclosed\n")
    assert main(["explain", "-f", str(bad), "--kubeconfig", none]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-binder explain: -f {bad}: cannot read a YAML/JSON document: "), err
    prose = tmp_path / "README.md"   # prose given by mistake: one line, where it fails
    prose.write_text("# Title\n\nSome words: and more words: here.\n")
    assert main(["explain", "-f", str(prose), "--kubeconfig", none]) == 2
    assert capsys.readouterr().err == (f"gpu-binder explain: -f {prose}: cannot read a YAML/JSON document: "
                                       "mapping values are not allowed here (line 3, column 27)\n")
    assert main(["explain", "-f", str(tmp_path), "--kubeconfig", none]) == 2
    assert capsys.readouterr().err == f"gpu-binder explain: -f {tmp_path}: a directory, not a file\n"
    noname = tmp_path / "noname.yaml"
    noname.write_text("kind: VirtualMachineInstance\nmetadata: {namespace: t}\n")
    assert main(["explain", "-f", str(noname), "--kubeconfig", none]) == 2
    assert capsys.readouterr().err == f"gpu-binder explain: -f {noname}: the VMI needs metadata.name\n"
    assert main(["explain", "ns/vm", "--timeout", "nan", "--kubeconfig", none]) == 2
    assert capsys.readouterr().err == "gpu-binder explain: --timeout must be > 0 seconds, got nan\n"


@pytest.mark.parametrize("text, says", [
    ("garbage: [\n", "not valid YAML: expected the node content, but found '<stream end>' "
                     "(line 2, column 1)"),
    ("a: [b", "not valid YAML: expected ',' or ']', but got '<stream end>' (line 1, column 6)"),
    ("a: b: c\n", "not valid YAML: mapping values are not allowed here (line 1, column 5)"),
    ("", "not a kubeconfig (a mapping with clusters, users and contexts) but an empty file"),
    ("- a\n- b\n", "not a kubeconfig (a mapping with clusters, users and contexts) but a list"),
    ("gpu-node-1\n", "not a kubeconfig (a mapping with clusters, users and contexts) but plain text"),
])
@pytest.mark.parametrize("command", [["top"], ["health"], ["health", "clear", "hgx-node-01/gpu-vfio-3"]])
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(capsys, tmp_path, text, says, command):
    """Bad YAML says what the parser expected and where (its first line, 'while parsing a
    flow sequence', said neither), as `explain -f` does; `health clear` as `health`."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    assert main([*command, "--kubeconfig", str(kubeconfig)]) == 2
    assert capsys.readouterr().err == f"gpu-binder {command[0]}: --kubeconfig {kubeconfig}: {says}\n"


def _kubeconfig(cluster: str = "{server: 'https://127.0.0.1:1'}", user: str = "{token: t}",
                context: str = "{cluster: k, user: u}") -> str:
    """A kubeconfig of one cluster k, user u and context c (current), each body as given."""
    return ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {cluster}}}]\n"
            f"users: [{{name: u, user: {user}}}]\n"
            f"contexts: [{{name: c, context: {context}}}]\n")


_EXEC = "{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {command}, args: {args}}}}}"


_WRONG_SHAPES = [
    # kubernetes_asyncio: AttributeError 'int' object has no attribute 'safe_get' (a traceback)
    (_kubeconfig(context="7"),
     "not a kubeconfig: contexts[0].context is a number, not a mapping"),
    # TypeError 'int' object is not iterable
    ("current-context: c\ncontexts: 5\n", "not a kubeconfig: contexts is a number, not a list"),
    ("current-context: c\nclusters: [k]\n", "not a kubeconfig: clusters[0] is a string, not a mapping"),
    # ConfigException naming a ConfigNode object's repr
    ("current-context: [c]\n", "not a kubeconfig: current-context is a list, not a name"),
    # a body, or a value inside one, of the wrong shape: kubernetes_asyncio said
    # "Expected object with name <kubernetes_asyncio.config.kube_config.ConfigNode object at 0x…>"
    (_kubeconfig(context="{cluster: [k], user: u}"),
     "not a kubeconfig: contexts[0].context.cluster is a list, not a name"),
    (_kubeconfig(context="{cluster: k, user: {name: u}}"),
     "not a kubeconfig: contexts[0].context.user is a mapping, not a name"),
    (_kubeconfig(cluster="[{server: 'https://127.0.0.1:1'}]"),
     "not a kubeconfig: clusters[0].cluster is a list, not a mapping"),
    (_kubeconfig(user="[{token: t}]"), "not a kubeconfig: users[0].user is a list, not a mapping"),
    (_kubeconfig(context="[{cluster: k}, {user: u}]"),
     "not a kubeconfig: contexts[0].context is a list, not a mapping"),
    # "argument should be a bytes-like object or ASCII string, not 'ConfigNode'"
    (_kubeconfig(cluster="{server: 'https://127.0.0.1:1', certificate-authority-data: [x]}"),
     "not a kubeconfig: clusters[0].cluster.certificate-authority-data is a list, not a string"),
    # "[Errno 2] No such file or directory: '<…ConfigNode object at 0x…>'", after a log line
    (_kubeconfig(user=_EXEC.format(command="[/bin/true]", args="[]")),
     "not a kubeconfig: users[0].user.exec.command is a list, not a string"),
    # "exec: malformed request. invalid args list '<…ConfigNode object at 0x…>'"
    (_kubeconfig(user=_EXEC.format(command="/bin/true", args="{a: b}")),
     "not a kubeconfig: users[0].user.exec.args is a mapping, not a list"),
    (_kubeconfig(user="{exec: [/bin/true]}"),
     "not a kubeconfig: users[0].user.exec is a list, not a mapping"),
    # handed to the process as they are: "expected str, bytes or os.PathLike object, not int"
    (_kubeconfig(user=_EXEC.format(command="/bin/true", args="[a, 5]")),
     "not a kubeconfig: users[0].user.exec.args[1] is a number, not a string"),
    (_kubeconfig(user="{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true, "
                      "env: [{name: A, value: 1}]}}"),
     "not a kubeconfig: users[0].user.exec.env[0].value is a number, not a string"),
    # the current context names what the file lacks: "argument of type 'NoneType' is not
    # iterable" for a user, kubernetes_asyncio's words naming a path for the rest
    (_kubeconfig(context="{cluster: k, user: nobody}"),
     "not a usable kubeconfig: context c names user nobody, which users lacks"),
    (_kubeconfig(context="{cluster: k}"),
     "not a usable kubeconfig: context c names no user (needed for its https server)"),
    (_kubeconfig(context="{cluster: other, user: u}"),
     "not a usable kubeconfig: context c names cluster other, which clusters lacks"),
    (_kubeconfig(context="{user: u}"), "not a usable kubeconfig: context c names no cluster"),
    (_kubeconfig().replace("current-context: c", "current-context: d"),
     "not a usable kubeconfig: current-context d names no entry of contexts"),
    # a bare AssertionError, no message (a traceback)
    (_kubeconfig(cluster="{server: 5}"),
     "not a usable kubeconfig: AssertionError in kubernetes_asyncio's loader (a value of the "
     "wrong type?)"),
]


@pytest.mark.parametrize("text, says", _WRONG_SHAPES)
@pytest.mark.parametrize("command", [["top"], ["health"], ["health", "clear", "hgx-node-01/gpu-vfio-3"]])
def test_a_kubeconfig_of_the_wrong_shape_is_one_line_and_exit_2(capsys, tmp_path, text, says, command):
    """Valid YAML whose parts have the wrong shape: one line naming the part (or, for what
    kubernetes_asyncio trips on past that, its error), exit 2, not a traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    assert main([*command, "--kubeconfig", str(kubeconfig), "--timeout", "5"]) == 2
    assert capsys.readouterr().err == f"gpu-binder {command[0]}: --kubeconfig {kubeconfig}: {says}\n"


@pytest.mark.parametrize("text, says", [
    ("garbage: [\n", "not valid YAML: expected the node content, but found '<stream end>' "
                     "(line 2, column 1)"),
    ("", "not a kubeconfig (a mapping with clusters, users and contexts) but an empty file"),
    # kubernetes_asyncio's loader itself (the AssertionError) is past the check: not here
    *[(text, says) for text, says in _WRONG_SHAPES if "kubernetes_asyncio" not in says]])
@pytest.mark.parametrize("command", ["controller", "webhook"])
def test_the_controllers_kubeconfig_of_the_wrong_shape_is_one_line_and_exit_2(
        capsys, tmp_path, monkeypatch, text, says, command):
    """`gpu-binder controller|webhook --kubeconfig FILE` judges FILE as `top` does
    (`cli.tools.check_kubeconfig`), before the replica starts: the same line, exit 2. It
    logged "cannot build an API client" with the loader's words, such as "TypeError:
    argument of type 'NoneType' is not iterable" for a context naming a missing user."""
    import k8s.controller

    def started(cfg):
        raise AssertionError("the replica started")

    monkeypatch.setattr(k8s.controller, "Controller", started)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(text)
    assert main([command, "--kubeconfig", str(kubeconfig), "--webhook-port", "0"]) == 2
    assert capsys.readouterr().err == f"gpu-binder {command}: --kubeconfig {kubeconfig}: {says}\n"


def test_the_controllers_kubeconfig_from_the_environment_is_judged_too(capsys, tmp_path,
                                                                       monkeypatch):
    import k8s.controller

    def started(cfg):
        raise AssertionError("the replica started")

    monkeypatch.setattr(k8s.controller, "Controller", started)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig(context="{cluster: k, user: nobody}"))
    monkeypatch.setenv("GPU_BINDER_KUBECONFIG", str(kubeconfig))
    assert main(["controller", "--webhook-port", "0"]) == 2
    assert capsys.readouterr().err == (f"gpu-binder controller: --kubeconfig {kubeconfig}: not a "
                                       f"usable kubeconfig: context c names user nobody, which "
                                       f"users lacks\n")


def test_the_controller_with_a_kubeconfig_of_the_right_shape_starts(tmp_path, monkeypatch):
    import k8s.controller

    started = []

    class Replica:
        def __init__(self, cfg):
            self.cfg = cfg

        async def run(self) -> int:
            started.append(self.cfg.kubeconfig)
            return 0

    monkeypatch.setattr(k8s.controller, "Controller", Replica)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig())
    assert main(["controller", "--kubeconfig", str(kubeconfig), "--webhook-port", "0"]) == 0
    assert started == [str(kubeconfig)]


def _exec_plugin(tmp_path, script: str) -> str:
    """A kubeconfig (in `tmp_path`) whose user's credentials come from an exec plugin, the
    shell `script`."""
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(f"#!/bin/sh\n{script}\n")
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(_kubeconfig(user=_EXEC.format(command=str(plugin), args="[]")))
    return str(kubeconfig)


@pytest.mark.parametrize("script, says", [
    ("exit 1", "exec: process returned 1"),
    ("echo 'not logged in' >&2; exit 3", "exec: process returned 3. not logged in"),
])
@pytest.mark.parametrize("command", [["top"], ["health"]])
def test_a_failing_exec_plugin_is_our_one_line_only(capsys, caplog, tmp_path, script, says, command):
    """kubernetes_asyncio logs the plugin's failure before raising it; that record is dropped
    (it reached stderr a line before ours, by Python's last-resort handler), ours says it."""
    kubeconfig = _exec_plugin(tmp_path, script)
    assert main([*command, "--kubeconfig", kubeconfig, "--timeout", "5"]) == 2
    assert capsys.readouterr().err == (f"gpu-binder {command[0]}: --kubeconfig {kubeconfig}: "
                                       f"not a usable kubeconfig: {says}\n")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kubernetes_asyncio")] == []
    assert logging.getLogger("kubernetes_asyncio").propagate   # as it was


def test_a_failing_exec_plugin_is_one_line_on_the_real_stderr(tmp_path):
    """As a user runs it (no pytest handlers on the logging tree, so Python's last-resort
    handler is the one that printed the loader's record): stderr is our line alone."""
    import subprocess
    import sys

    kubeconfig = _exec_plugin(tmp_path, "exit 1")
    proc = subprocess.run([sys.executable, "-m", "cli.main", "top", "--kubeconfig", kubeconfig,
                           "--timeout", "5"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, f"gpu-binder top: --kubeconfig {kubeconfig}: not "
                                                 f"a usable kubeconfig: exec: process returned 1\n")


def test_what_the_kubeconfig_loader_warns_of_on_success_is_passed_on(caplog, tmp_path):
    """A plugin answering without a token: the loader logs it and goes on; the record still
    reaches the logging tree (only a failure's record, said by our line, is dropped)."""
    kubeconfig = _exec_plugin(tmp_path, "echo '{\"apiVersion\": \"client.authentication.k8s.io/v1\", "
                                        "\"kind\": \"ExecCredential\", \"status\": {}}'")
    assert main(["top", "--kubeconfig", kubeconfig, "--timeout", "5"]) == 2   # no server at :1
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kubernetes_asyncio")] == [
        "exec: missing token or clientCertificateData field in plugin output"]


def test_health_against_no_api_server_says_it_cannot_reach_it(capsys, tmp_path):
    """As `top` words it: the server and the OS's words, no HTTP status 0 (the newcomer)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    assert main(["health", "--kubeconfig", str(kubeconfig), "--timeout", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-binder health: cannot reach the API server of {kubeconfig}: "
                          "127.0.0.1:1: "), err
    assert err.count("\n") == 1, err


def test_output_to_a_reader_that_went_away_ends_quietly_with_141():
    """`gpu-binder top | head`: a closed pipe ends the command with 141, no traceback."""
    import subprocess
    import sys

    code = ("import argparse; from cli.main import _run\n"
            "def spam(_):\n"
            "    for i in range(200000): print('row', i)\n"
            "raise SystemExit(_run(argparse.Namespace(func=spam)))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()  # the reader goes away
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, b"")


@pytest.mark.parametrize("argv, flag, message", [
    (["bench", "scale", "--nodes", "-5"], "--nodes", "must be at least 1, got -5"),
    (["bench", "scale", "--settle-load", "0"], "--settle-load", "takes a finite load average above 0"),
    (["bench", "scale", "--settle-load", "nan"], "--settle-load", "takes a finite load average"),
    (["bench", "scale", "--settle-load", "inf"], "--settle-load", "takes a finite load average"),
    (["bench", "packing", "--nodes", "0"], "--nodes", "must be at least 1, got 0"),
    (["bench", "soak", "--nodes", "x"], "--nodes", "invalid int value: 'x'"),
    (["cluster", "up", "--controllers", "-1"], "--controllers", "must be at least 0, got -1"),
    (["demo", "--vmis", "0"], "--vmis", "must be at least 1, got 0"),
    (["demo", "--nodes", "1"], "--nodes", "must be at least 2, got 1"),
])
def test_counts_are_checked_before_anything_starts(capsys, argv, flag, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {message}" in err, err


def test_cluster_up_permit_needs_kubevirt(capsys, tmp_path):
    assert main(["cluster", "up", "--dir", str(tmp_path), "--permit", "nvidia.com/X"]) == 2
    assert "--permit names KubeVirt's permitted host devices: it needs --kubevirt" in \
        capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing was started


@pytest.mark.parametrize("flag", ["--hgx-nodes", "--l40s-nodes"])
def test_cluster_up_fleet_sizes_need_dra(capsys, tmp_path, flag):
    assert main(["cluster", "up", "--dir", str(tmp_path), flag, "2"]) == 2
    assert "--hgx-nodes and --l40s-nodes size the device-mode fleet: they need --dra" in \
        capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing was started


@pytest.mark.parametrize("extra, named", [
    (["--nodes", "3"], "--nodes"),
    (["--nodes", "4", "--vmi-only", "--seed", "3"], "--nodes, --seed, --vmi-only"),
])
def test_demo_dra_refuses_the_count_mode_flags_it_would_ignore(capsys, extra, named):
    """`demo --dra` runs a fixed HGX fleet: a count-mode flag beside it is refused (exit 2)
    naming the flags, before anything starts, rather than silently ignored."""
    assert main(["demo", "--dra", *extra]) == 2
    verb = "do" if "," in named else "does"
    assert f"gpu-binder demo: {named} {verb} not apply with --dra" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["bench", "packing", "--systems", "a,x"], "--systems takes a,b,c,e, got 'a,x'"),
    (["bench", "packing", "--loads", "0.95,1.2"], "--loads takes offered loads between 0 and 1"),
    (["bench", "packing", "--loads", "high"], "got 'high'"),
    (["bench", "packing", "--loads", "0.5,,0.7"], "got '0.5,,0.7'"),
    (["bench", "soak", "--nodes", "0"], "--nodes is KWOK nodes of 8 GPUs, at least 1, got 0"),
    (["bench", "soak", "--nodes", "-3"], "--nodes is KWOK nodes of 8 GPUs, at least 1, got -3"),
    (["bench", "soak", "--minutes", "61"], "--minutes is in (0, 60], got 61"),
    (["bench", "soak", "--minutes", "nan"], "--minutes is in (0, 60], got nan"),
    (["bench", "soak", "--minutes", "0"], "--minutes is in (0, 60], got 0"),
    (["bench", "soak", "--minutes", "-1"], "--minutes is in (0, 60], got -1"),
    (["bench", "soak", "--create-rate", "0"], "--create-rate is creates per second in (0, 50], got 0"),
    (["bench", "soak", "--steady-share", "0.9"], "--steady-share is in [0.2, 0.8], got 0.9"),
    (["bench", "soak", "--steady-share", "nan"], "--steady-share is in [0.2, 0.8], got nan"),
    (["bench", "e2e", "--gpus", "1,0"], "--gpus takes positive integers"),
    (["bench", "fairness", "--seats", "5,0"], "--seats takes positive integers"),
    (["bench", "fairness", "--seats", "5,600"], "--seats takes seat counts below the API "
                                                "server's 600, got '5,600'"),
    (["bench", "e2e", "--modes", "count,dra"], "--modes takes count and/or device"),
    (["bench", "scale", "--modes", ","], "--modes takes count and/or device"),
])
def test_bench_bad_values_exit_2_naming_the_flag(capsys, tmp_path, argv, message):
    """A bench flag's bad value is a usage error (exit 2, as argparse's and every other
    command's), said in one line naming the flag (no usage block), refused before any
    cluster starts."""
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, flag", [
    (["bench", "core", "--hgx"], "--hgx"),                 # packing's
    (["bench", "fairness", "--quick"], "--quick"),         # fairness has no quick form
    (["bench", "soak", "--modes", "device"], "--modes"),   # e2e's and scale's
    (["bench", "scale", "--seed", "3"], "--seed"),         # scale's workload is not seeded
    (["bench", "e2e", "--nodes", "10"], "--nodes"),
])
def test_bench_refuses_another_benchmarks_flag(capsys, tmp_path, argv, flag):
    """Each benchmark takes only the flags it reads: another's is a usage error (exit 2,
    naming it), not silently ignored, and nothing is written."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # reported by the benchmark's own parser, with its usage (newcomer: by "gpu-binder")
    assert f"gpu-binder bench {argv[1]}: error: unrecognized arguments: {flag}" in err
    assert err.startswith(f"usage: gpu-binder bench {argv[1]} ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, said", [
    (["--bogus"], "gpu-binder: error: unrecognized arguments: --bogus"),
    ([], "gpu-binder: error: the following arguments are required: COMMAND"),
    (["bench"], "gpu-binder bench: error: the following arguments are required: WHICH"),
    (["bench", "--bogus"], "gpu-binder bench: error: unrecognized arguments: --bogus"),
    (["cluster"], "gpu-binder cluster: error: the following arguments are required: ACTION"),
])
def test_an_unknown_option_before_the_command_is_named_not_taken_for_a_missing_command(capsys, argv, said):
    """`gpu-binder --bogus` says --bogus is not an argument (it used to say COMMAND was
    missing); a missing command is still reported by the parser that needs it."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == said


def test_an_unknown_argument_of_a_tool_is_reported_by_that_tool(capsys):
    with pytest.raises(SystemExit) as exc:
        kubectl_main(["top", "extra"])
    assert exc.value.code == 2
    assert "kubectl gpu top: error: unrecognized arguments: extra" in capsys.readouterr().err


def test_bench_out_that_is_a_file_is_refused_before_the_run(capsys, tmp_path):
    # newcomer: bench core --out /etc/passwd ran the whole benchmark, then a traceback
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert main(["bench", "core", "--quick", "--out", str(afile)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpu-binder bench core: --out {afile} exists and is not a directory")
    assert afile.read_text() == "x"


def _bench_runs_recorded(monkeypatch) -> list[str]:
    """Every benchmark's run replaced by one that records its name (and starts nothing)."""
    import dataclasses

    import bench.registry as registry

    ran: list[str] = []

    def recorded(args):
        ran.append(args.which)
        return 0

    monkeypatch.setattr(registry, "BENCHMARKS", [dataclasses.replace(b, run=recorded)
                                                 for b in registry.BENCHMARKS])
    return ran


BENCHMARK_NAMES = [b.name for b in BENCHMARKS]   # every `gpu-binder bench WHICH` has --out


@pytest.mark.parametrize("which", BENCHMARK_NAMES)
@pytest.mark.parametrize("below", [("x",), ("deeper", "x")])
def test_bench_out_below_a_file_is_refused_before_the_run(capsys, tmp_path, monkeypatch,
                                                          which, below):
    """`--out /etc/hostname/x` (newcomer: the whole soak ran, then a traceback making the
    directory): every benchmark refuses it before its run, one line naming the flag, the
    path and the file in the way, exit 2; the file is untouched."""
    ran = _bench_runs_recorded(monkeypatch)
    afile = tmp_path / "a-file"
    afile.write_text("x")
    out = afile.joinpath(*below)
    assert main(["bench", which, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"gpu-binder bench {which}: --out {out}: {afile} is not a directory\n")
    assert ran == [] and afile.read_text() == "x"
    assert main(["bench", which, "--out", str(tmp_path / "new" / "out")]) == 0   # can be made
    assert ran == [which] and not (tmp_path / "new").exists()                   # not made yet


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any directory")
def test_bench_out_in_an_unwritable_directory_is_refused_before_the_run(capsys, tmp_path,
                                                                        monkeypatch):
    ran = _bench_runs_recorded(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        for out in (locked, locked / "out"):
            assert main(["bench", "soak", "--out", str(out)]) == 2
            assert capsys.readouterr().err == (
                f"gpu-binder bench soak: --out {out}: {locked} is not writable\n")
    finally:
        locked.chmod(0o700)
    assert ran == []


def test_bench_interrupted_is_one_line_and_exit_130(capsys, tmp_path, monkeypatch):
    # newcomer: Ctrl-C during a benchmark printed a traceback
    import dataclasses

    import bench.registry as registry

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "BENCHMARKS", [
        dataclasses.replace(b, run=interrupted) if b.name == "core" else b
        for b in registry.BENCHMARKS])
    assert main(["bench", "core", "--quick", "--out", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.strip() == (
        "gpu-binder bench core: interrupted; the processes it started were stopped, no report "
        "written")


def test_bench_help_lists_only_the_benchmarks_own_flags():
    """`gpu-binder bench WHICH --help`: each sub-command's flags, the ones its run reads."""
    which = next(a for a in next(p for path, p in _parsers(build_parser(), "gpu-binder")
                                 if path == "gpu-binder bench")._actions
                 if isinstance(a, argparse._SubParsersAction))
    flags = {name: {o for a in p._actions for o in a.option_strings if o.startswith("--")}
             - {"--help"} for name, p in which.choices.items()}
    assert flags == {
        "core": {"--out", "--quick", "--seed"},
        "e2e": {"--out", "--quick", "--seed", "--gpus", "--levels", "--modes",
                "--vs-scheduler", "--vmis", "--pprof", "--py-spy"},
        "floor": {"--out", "--quick", "--modes", "--sizes", "--seats"},
        "packing": {"--out", "--quick", "--seed", "--simulate", "--hgx", "--nodes",
                    "--arrivals", "--systems", "--loads"},
        "contention": {"--out", "--quick", "--seed", "--nodes", "--span", "--recreate-delay",
                       "--lanes", "--drain", "--reserve-after", "--on-demand-share"},
        "fairness": {"--out", "--seats"},
        "scale": {"--out", "--quick", "--nodes", "--vmis", "--baseline-nodes", "--sizes",
                  "--modes", "--settle-load"},
        "soak": {"--out", "--seed", "--nodes", "--minutes", "--create-rate", "--mode", "--tracemalloc",
                 "--priorities", "--steady-share"},
        "health": {"--out", "--seed", "--nodes", "--minutes"},
    }


def test_bench_without_a_benchmark_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2
    assert "required: WHICH" in capsys.readouterr().err


def test_explain_json_reports_an_error_as_json(capsys, tmp_path):
    """`explain --json`: an error is a JSON object on stdout (and the plain line on
    stderr), exit 2, so a script reading stdout can tell it from an explanation."""
    import json

    assert main(["explain", "ns/vm", "--json", "--kubeconfig", str(tmp_path / "none")]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert set(doc) == {"error"} and "--kubeconfig" in doc["error"], doc
    assert err.startswith("gpu-binder explain: ") and doc["error"] in err


def test_explain_file_in_a_namespace_the_cluster_lacks_is_refused_naming_it(tmp_path):
    # newcomer: `explain -f vmi.yaml -n nosuchns` printed a verdict with no budget or
    # entitlement, as if the namespace were there
    import yaml

    from cli.tools import Cluster, ToolError, load_vmi
    from model.snapshot import Snapshot
    from model.types import Namespace

    manifest = tmp_path / "vmi.yaml"
    manifest.write_text(yaml.safe_dump({"kind": "VirtualMachineInstance",
                                        "metadata": {"name": "vm", "namespace": "gone"}}))
    cluster = Cluster(Snapshot.build(namespaces=[Namespace("tenant-a")]), set(), {})
    with pytest.raises(ToolError, match=r"namespace 'nosuchns' \(-n\) not found in the cluster"):
        load_vmi(None, str(manifest), "nosuchns", cluster)
    with pytest.raises(ToolError, match=r"namespace 'gone' \(its metadata.namespace\) not found"):
        load_vmi(None, str(manifest), None, cluster)
    assert load_vmi(None, str(manifest), "tenant-a", cluster)["metadata"]["namespace"] == "tenant-a"
