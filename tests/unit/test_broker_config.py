"""gfxbpf-broker flags and --check-policy."""

from __future__ import annotations

import io

import pytest

from gfxbpf.broker import config

SHA = "a" * 64


def test_defaults():
    cfg = config.parse_args([])
    assert cfg.policy == "/etc/gfxbpf/policy.toml"
    assert cfg.socket == "/run/gfxbpf/control.sock"
    assert cfg.grpc is None and cfg.user is None and cfg.catalog is None
    assert cfg.check_policy is False and cfg.log_level == "info"


def test_all_flags():
    cfg = config.parse_args(
        [
            "--policy",
            "/p.toml",
            "--socket",
            "/s.sock",
            "--grpc",
            "127.0.0.1:50051",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-client-ca",
            "ca.pem",
            "--catalog",
            "/cat",
            "--user",
            "gfxbpf",
            "--check-policy",
            "--log-level",
            "debug",
        ]
    )
    assert (cfg.policy, cfg.socket, cfg.grpc) == ("/p.toml", "/s.sock", "127.0.0.1:50051")
    assert (cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) == ("c.pem", "k.pem", "ca.pem")
    assert (cfg.catalog, cfg.user, cfg.check_policy, cfg.log_level) == (
        "/cat",
        "gfxbpf",
        True,
        "debug",
    )
    assert not cfg.grpc_is_unix and cfg.grpc_unix_path is None


@pytest.mark.parametrize(
    "addr, path",
    [
        ("unix:/run/gfxbpf/grpc.sock", "/run/gfxbpf/grpc.sock"),
        ("unix:///run/g.sock", "/run/g.sock"),
    ],
)
def test_grpc_unix(addr, path):
    cfg = config.parse_args(["--grpc", addr])
    assert cfg.grpc_is_unix and cfg.grpc_unix_path == path


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--grpc", "0.0.0.0:50051"], "needs mTLS"),
        (["--grpc", "nonsense"], "expected unix:/absolute/path or host:port"),
        (["--grpc", "unix:relative.sock"], "use an absolute path"),
        (
            ["--grpc", "h:70000", "--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "a"],
            "expected unix:",
        ),
        (["--grpc", "[::]:1", "--tls-cert", "c"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "c", "--tls-key", "k"], "add --grpc"),
        (["--grpc", "unix:/g", "--tls-client-ca", "a"], "--tls-client-ca needs"),
        (["--socket", "rel.sock"], "--socket rel.sock: use an absolute path"),
        (["--log-level", "loud"], "invalid choice"),
    ],
)
def test_bad_combinations(argv, message, capsys):
    with pytest.raises(SystemExit) as ei:
        config.parse_args(argv)
    assert ei.value.code == 2
    assert message in capsys.readouterr().err


def test_ipv6_with_mtls():
    cfg = config.parse_args(
        ["--grpc", "[::]:50051", "--tls-cert", "c", "--tls-key", "k", "--tls-client-ca", "a"]
    )
    assert cfg.grpc == "[::]:50051"


def test_check_policy_ok(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(
        f'[[program]]\nname = "syscount"\nsha256 = "{SHA}"\nusers = ["root", "no-such-gfx"]\n'
    )
    out = io.StringIO()
    assert config.check_policy(str(path), out, use_catalog=False) == 0
    text = out.getvalue()
    assert "1 [[program]] entries for 1 programs" in text
    assert "warning:" in text and 'no user "no-such-gfx"' in text
    assert text.rstrip().endswith(f"{path}: OK (1 warnings)")


def test_check_policy_invalid(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('[[program]]\nname = "syscount"\nsha256 = "abc"\nscope = "world"\n')
    out = io.StringIO()
    assert config.check_policy(str(path), out, use_catalog=False) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"error: {path}: [[program]] #1 \"syscount\": field 'sha256'")
    assert lines[1].startswith(f"error: {path}: [[program]] #1 \"syscount\": field 'scope'")
    assert lines[-1] == f"{path}: INVALID (2 problems)"


def test_check_policy_missing_file(tmp_path):
    out = io.StringIO()
    assert config.check_policy(str(tmp_path / "none.toml"), out) == 1
    assert "cannot read the policy" in out.getvalue()


def test_check_policy_against_packaged_catalog(tmp_path):
    from gfxbpf.catalog.entries import load_catalog

    syscount = load_catalog().get("syscount")
    path = tmp_path / "policy.toml"
    path.write_text(
        f'[[program]]\nname = "syscount"\nsha256 = "{syscount.sha256}"\nusers = ["root"]\n'
        f"scope = {list(syscount.scopes)!r}\n".replace("'", '"')
        + f'[[program]]\nname = "syscount"\nsha256 = "{SHA}"\nusers = ["root"]\n'
        + f'[[program]]\nname = "nosuchprog"\nsha256 = "{SHA}"\nusers = ["root"]\n'
    )
    out = io.StringIO()
    assert config.check_policy(str(path), out) == 0
    warnings = [x for x in out.getvalue().splitlines() if x.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert "#2 \"syscount\": field 'sha256': the catalog's object has sha256" in warnings[0]
    assert '#3 "nosuchprog": no program "nosuchprog" in the catalog' in warnings[1]


def test_check_policy_catalog_dir(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("")
    out = io.StringIO()
    assert config.check_policy(str(path), out, catalog=str(tmp_path)) == 0
    assert "warning: catalog not checked: " in out.getvalue()
    assert "cannot read the catalog: No such file" in out.getvalue()
