"""server.yaml's oidc section: checked like every setting, with the key and line named."""

from __future__ import annotations

import pytest

from llmgw.config import ConfigError, ServerConfig, parse

GOOD = """
oidc:
  issuer: https://login.example.edu/realms/uni
  client_id: llmgw
  client_secret_file: /etc/llmgw/oidc-secret
  allowed_groups: [physics-all]
  rules:
    - {group: physics-staff, org: physics, role: manager}
    - {group: physics-all, org: physics, project: lhc}
"""


def test_a_site_s_settings_are_read() -> None:
    oidc = parse(GOOD, ServerConfig).oidc
    assert oidc.issuer == "https://login.example.edu/realms/uni"
    assert [(r.group, r.org, r.project, r.role) for r in oidc.rules] == [
        ("physics-staff", "physics", "", "manager"),
        ("physics-all", "physics", "lhc", "member"),
    ]
    assert parse("", ServerConfig).oidc.issuer == ""  # off by default


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("oidc: {issuer: http://login.example.edu, client_id: x}", "is not an https:// URL"),
        ("oidc: {issuer: https://login.example.edu}", "client_id: needed"),
        ("oidc: {scopes: [email]}", "scopes: must include openid"),
        ("oidc:\n  rules: [{group: g, org: o, role: boss}]", "'boss' is not admin"),
        ("oidc:\n  client_secret: hunter2", "oidc.client_secret: unknown key"),
        ("oidc: {session_ttl_s: 10}", "oidc.session_ttl_s"),
    ],
)
def test_a_wrong_setting_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(text, ServerConfig, "server.yaml")
    assert why in str(e.value)
    assert "hunter2" not in str(e.value)


def test_plain_http_is_for_a_provider_on_loopback_only() -> None:
    text = "oidc: {issuer: 'http://localhost:9400', client_id: x}"
    assert parse(text, ServerConfig).oidc.issuer == "http://localhost:9400"
