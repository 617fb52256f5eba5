"""Fixtures the operator tools' tests share: a kubeconfig whose server nobody answers (the
tests stub the API classes the tool calls)."""

from __future__ import annotations

import pytest

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: alice, user: {token: x}}]
contexts: [{name: ops, context: {cluster: c, user: alice}}]
current-context: ops
"""


@pytest.fixture
def kubeconfig(tmp_path) -> str:
    """The path of a kubeconfig file (`KUBECONFIG`) in the test's temporary directory."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return str(path)
