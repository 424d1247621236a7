"""Policy parsing, validation messages, decisions, library globs, limits."""

from __future__ import annotations

import os

import pytest

from gfxbpf.broker.errors import DENIAL_CODES
from gfxbpf.broker.policy import report
from gfxbpf.broker.policy.rules import (
    Limits,
    NameResolver,
    Policy,
    PolicyError,
)

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64


class FakeResolver(NameResolver):
    users = {"alice": 1001, "bob": 1002, "carol": 1003, "alias": 1001}
    groups = {"video": 44, "render": 105}

    def uid_of(self, name: str) -> int | None:
        return self.users.get(name)

    def gid_of(self, name: str) -> int | None:
        return self.groups.get(name)

    def user_name(self, uid: int) -> str | None:
        return next((n for n, u in self.users.items() if u == uid), None)


POLICY = f"""
[[program]]
name = "syscount"
sha256 = "{SHA_A.upper()}"
users = ["alice", 1004]
scope = "self"

[[program]]
name = "syscount"
sha256 = "{SHA_A}"
groups = ["video"]
scope = "system"

[[program]]
name = "vmabind"
sha256 = "{SHA_B}"
users = ["*"]
scope = ["self", "system"]

[[program]]
name = "ucalls"
sha256 = "{SHA_C}"
users = ["bob"]
libraries = ["/usr/lib/x86_64-linux-gnu/libvulkan.so.1*"]
functions = ["vk*"]

[limits]
sessions_per_user = 2
"""


@pytest.fixture
def policy() -> Policy:
    return Policy.parse(POLICY, path="policy.toml", resolver=FakeResolver())


def _errors(text: str) -> list[str]:
    with pytest.raises(PolicyError) as ei:
        Policy.parse(text, path="/etc/gfxbpf/policy.toml", resolver=FakeResolver())
    assert ei.value.path == "/etc/gfxbpf/policy.toml"
    assert str(ei.value) == "\n".join(ei.value.problems)
    return ei.value.problems


# ---------------------------------------------------------------- parsing


def test_parse_entries(policy):
    assert [e.name for e in policy.programs] == ["syscount", "syscount", "vmabind", "ucalls"]
    first = policy.programs[0]
    assert first.index == 1 and first.sha256 == SHA_A  # normalized to lower case
    assert first.users == ("alice", 1004) and first.groups == ()
    assert first.scopes == ("self",)
    assert first.label == '[[program]] #1 "syscount"'
    assert first.where == 'policy.toml [[program]] #1 "syscount"'
    assert policy.programs[2].scopes == ("self", "system")
    assert policy.programs[3].functions == ("vk*",)
    assert policy.programs[0].functions == ("*",)


def test_limits_defaults_and_overrides(policy):
    assert policy.limits.sessions_per_user == 2
    assert policy.limits.attachments_per_user == Limits().attachments_per_user == 16
    assert Policy.parse("").limits == Limits()


def test_scope_defaults_to_self():
    p = Policy.parse(f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\nusers = ["*"]\n')
    assert p.programs[0].scopes == ("self",)


def test_allow_no_btf_is_off_unless_set_to_true():
    base = f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\nusers = ["*"]\n'
    assert Policy.parse(base).programs[0].allow_no_btf is False
    assert Policy.parse(base + "allow_no_btf = true\n").programs[0].allow_no_btf is True
    errs = _errors(base + 'allow_no_btf = "yes"\n')
    assert errs == [
        "/etc/gfxbpf/policy.toml: [[program]] #1 \"x\": field 'allow_no_btf': "
        'expected true or false, got string "yes"'
    ]


def test_admin_approve_writes_allow_no_btf(capsys):
    from gfxbpf.broker import admin

    argv = ["approve", "syscount", "--users", "alice", "--allow-no-btf"]
    assert admin.main(argv) == 0
    assert Policy.parse(capsys.readouterr().out, path="p.toml").programs[0].allow_no_btf
    assert admin.main(argv[:-1]) == 0
    assert not Policy.parse(capsys.readouterr().out, path="p.toml").programs[0].allow_no_btf


def test_empty_policy_denies_everything():
    p = Policy.parse("", path="empty.toml")
    d = p.decide(0, [0], "syscount", SHA_A, "self")
    assert not d.allowed
    assert d.rule == 'default deny: no [[program]] entry names "syscount"'


def test_load_from_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    p = Policy.load(path, resolver=FakeResolver())
    assert p.path == str(path)
    assert p.decide(1001, [], "syscount", SHA_A, "self").rule.startswith(
        f'{path} [[program]] #1 "syscount"'
    )


def test_load_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(PolicyError, match="nope.toml: cannot read the policy"):
        Policy.load(missing)


def test_load_not_utf8(tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(b"name = '\xff'\n")
    with pytest.raises(PolicyError, match="bin.toml: not UTF-8"):
        Policy.load(path)


# ---------------------------------------------------------------- validation errors


def test_toml_syntax_error_names_file():
    (msg,) = _errors("[[program]\nname = 1")
    assert msg.startswith("/etc/gfxbpf/policy.toml: TOML syntax error")
    assert "line 1" in msg


def test_unknown_keys_everywhere():
    errs = _errors(
        f"""
colour = "blue"
[[program]]
name = "syscount"
sha256 = "{SHA_A}"
user = ["alice"]
[limits]
sessions = 3
"""
    )
    assert errs[0] == (
        "/etc/gfxbpf/policy.toml: top level: field 'colour': unknown key "
        "(known: program, limits, tls_client)"
    )
    assert any(
        e.startswith(
            "/etc/gfxbpf/policy.toml: [[program]] #1 \"syscount\": field 'user': unknown key"
        )
        for e in errs
    )
    assert any("[limits]: field 'sessions': unknown key" in e for e in errs)
    assert len(errs) == 3


def test_errors_name_entry_and_field():
    errs = _errors(
        f"""
[[program]]
name = "ok"
sha256 = "{SHA_A}"

[[program]]
name = "syscount"
sha256 = "1234"
scope = "world"
users = ["alice", true, "1001", "bad name!", -3]
groups = "video"
libraries = ["lib/relative.so", "/usr/../etc/x"]
functions = "vk*"
description = 5
"""
    )
    prefix = '/etc/gfxbpf/policy.toml: [[program]] #2 "syscount": '
    assert all(e.startswith(prefix) for e in errs), errs
    text = "\n".join(errs)
    assert "field 'sha256': expected 64 hex digits, got string \"1234\"" in text
    assert "field 'scope': unknown scope \"world\"" in text
    assert (
        "field 'users': each item must be a user name (string) or uid (integer), got boolean"
        in text
    )
    assert "field 'users': write uids as integers: 1001 rather than \"1001\"" in text
    assert "field 'users': \"bad name!\" is not a valid user name" in text
    assert "field 'users': uid -3 is out of range" in text
    assert "field 'groups': expected an array of group names or gids" in text
    assert "field 'libraries': \"lib/relative.so\" is not an absolute path" in text
    assert "field 'libraries': \"/usr/../etc/x\" contains a '..' component" in text
    assert "field 'functions': expected an array of non-empty strings" in text
    assert "field 'description': expected a string, got integer" in text


def test_missing_name_and_hash():
    errs = _errors("[[program]]\nusers = ['alice']\n")
    assert errs == [
        "/etc/gfxbpf/policy.toml: [[program]] #1: field 'name': missing (the catalog program's "
        "name)",
        "/etc/gfxbpf/policy.toml: [[program]] #1: field 'sha256': missing (`gfxbpf-admin "
        "approve NAME` prints the entry with its hash)",
    ]


def test_bad_sha_types():
    errs = _errors('[[program]]\nname = "x"\nsha256 = 12\n')
    assert errs == [
        "/etc/gfxbpf/policy.toml: [[program]] #1 \"x\": field 'sha256': expected 64 hex "
        "digits, got integer 12"
    ]
    errs = _errors(f'[[program]]\nname = "x"\nsha256 = "{"g" * 64}"\n')
    assert "expected 64 hex digits" in errs[0]


@pytest.mark.parametrize("value", ["0", "-1", "true", '"8"', "1.5", "2147483648"])
def test_limits_must_be_positive_ints(value):
    errs = _errors(f"[limits]\nattachments_per_user = {value}\n")
    assert len(errs) == 1
    assert errs[0].startswith("/etc/gfxbpf/policy.toml: [limits]: field 'attachments_per_user': ")


def test_program_must_be_array_of_tables():
    errs = _errors('program = "syscount"\n')
    assert errs == [
        "/etc/gfxbpf/policy.toml: top level: field 'program': "
        "write each as a [[program]] table, got string"
    ]
    errs = _errors("[[programs]]\nname = 'x'\n")
    assert "did you mean [[program]]?" in errs[0]


def test_scope_list_validation():
    errs = _errors(f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\nscope = []\n')
    assert 'field \'scope\': expected "self", "system", "job" or an array of them' in errs[0]
    p = Policy.parse(f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\nscope = ["system"]\n')
    assert p.programs[0].scopes == ("system",)


def test_all_problems_reported_at_once():
    errs = _errors(
        f"""
[[program]]
name = "a"
sha256 = "x"
[[program]]
name = "b"
sha256 = "{SHA_A}"
scope = "nope"
[limits]
lease_seconds = 0
"""
    )
    assert len(errs) == 3
    assert '#1 "a"' in errs[0] and '#2 "b"' in errs[1] and "[limits]" in errs[2]


# ---------------------------------------------------------------- decisions


def test_allowed_by_user_name(policy):
    d = policy.decide(1001, [1001], "syscount", SHA_A, "self")
    assert d.allowed
    assert d.rule == 'policy.toml [[program]] #1 "syscount": users = ["alice", 1004]'
    assert d.entry is policy.programs[0]
    assert d.scope == "self"


def test_allowed_by_uid_and_alias(policy):
    assert policy.decide(1004, [], "syscount", SHA_A, "self").allowed
    # Two names may share a uid; the decision is by uid.
    assert policy.decide(1001, [], "syscount", SHA_A.upper(), "self").allowed


def test_allowed_by_group_second_entry(policy):
    d = policy.decide(1002, [1002, 44], "syscount", SHA_A, "system")
    assert d.allowed
    assert d.rule == 'policy.toml [[program]] #2 "syscount": groups = ["video"]'
    assert d.entry is policy.programs[1]


def test_wildcard_user(policy):
    d = policy.decide(4242, [], "vmabind", SHA_B, "system")
    assert d.allowed and d.rule.endswith('users = ["*"]')


def test_unknown_program_default_deny(policy):
    d = policy.decide(1001, [], "foo", SHA_A, "self")
    assert not d.allowed
    assert d.rule == 'default deny: no [[program]] entry names "foo"'
    assert d.entry is None


def test_user_not_named(policy):
    d = policy.decide(1003, [1003], "syscount", SHA_A, "self")
    assert not d.allowed
    assert d.rule == (
        'policy.toml [[program]] #1 "syscount", #2: users = ["alice", 1004], groups = [] do '
        "not include uid 1003 (carol) or any of its groups"
    )


def test_unknown_uid_in_message(policy):
    d = policy.decide(5555, [], "ucalls", SHA_C, "self")
    assert not d.allowed and "uid 5555 or any" in d.rule


def test_hash_mismatch_single_entry(policy):
    d = policy.decide(1002, [], "ucalls", SHA_A, "self")
    assert not d.allowed
    assert d.rule == (
        f'policy.toml [[program]] #4 "ucalls": sha256 = "{SHA_C}" does not match the '
        f"object's {SHA_A}"
    )


def test_hash_mismatch_several_entries(policy):
    d = policy.decide(1001, [], "syscount", SHA_B, "self")
    assert not d.allowed
    assert d.rule == (
        f'policy.toml [[program]] #1, #2 "syscount": no entry\'s sha256 matches the '
        f"object's {SHA_B}"
    )


def test_scope_not_allowed(policy):
    d = policy.decide(1001, [], "syscount", SHA_A, "system")
    assert not d.allowed
    assert d.rule == (
        'policy.toml [[program]] #1 "syscount": scope = ["self"] does not allow scope '
        '"system" for uid 1001 (alice) (allowed: self)'
    )


def test_unspecified_scope_picks_narrowest(policy):
    d = policy.decide(1, [], "vmabind", SHA_B, None)
    assert d.allowed and d.scope == "self"
    d = policy.decide(1002, [44], "syscount", SHA_A, None)
    assert d.allowed and d.scope == "system"  # only entry #2 admits bob


def test_invalid_scope(policy):
    d = policy.decide(1001, [], "syscount", SHA_A, "world")
    assert not d.allowed and "invalid scope" in d.rule


def test_uploaded_bytes_by_hash(policy):
    d = policy.decide(1001, [], None, SHA_A, "self")
    assert d.allowed and d.entry is policy.programs[0]
    d = policy.decide(1001, [], None, "d" * 64, "self")
    assert not d.allowed
    assert d.rule == f"default deny: no [[program]] entry approves sha256 {'d' * 64}"


def test_programs_for(policy):
    assert [e.index for e in policy.programs_for(1001, [])] == [1, 3]
    assert [e.index for e in policy.programs_for(1002, [44])] == [2, 3, 4]


def test_real_resolver_root():
    p = Policy.parse(f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\nusers = ["root"]\n')
    assert p.decide(0, [], "x", SHA_A, "self").allowed
    assert not p.decide(65534, [], "x", SHA_A, "self").allowed
    p = Policy.parse(f'[[program]]\nname = "x"\nsha256 = "{SHA_A}"\ngroups = ["root"]\n')
    assert p.decide(12345, [0], "x", SHA_A, "self").allowed


# ---------------------------------------------------------------- libraries, functions


def _lib_policy(tmp_path, pattern: str) -> Policy:
    return Policy.parse(
        f'[[program]]\nname = "u"\nsha256 = "{SHA_A}"\nusers = ["*"]\n'
        f"libraries = [{pattern!r}]\n".replace("'", '"')
    )


def test_library_globs_real_path(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    real = lib / "libvulkan.so.1.3.275"
    real.write_bytes(b"\x7fELF")
    (lib / "libvulkan.so.1").symlink_to(real.name)
    other = tmp_path / "evil"
    other.mkdir()
    (other / "libvulkan.so.1").write_bytes(b"\x7fELF")
    # A symlink elsewhere pointing into the allowed dir resolves to an allowed file.
    (other / "link.so").symlink_to(real)
    # A symlink in the allowed dir pointing out of it does not.
    (lib / "libvulkan.so.1.9").symlink_to(other / "libvulkan.so.1")

    p = _lib_policy(tmp_path, f"{lib}/libvulkan.so.1*")
    e = p.programs[0]
    assert p.library_allowed(e, str(real))
    assert p.library_allowed(e, str(lib / "libvulkan.so.1"))
    assert p.library_allowed(e, str(other / "link.so"))
    assert p.library_allowed(e, f"{lib}/../lib/libvulkan.so.1")
    assert not p.library_allowed(e, str(other / "libvulkan.so.1"))
    assert not p.library_allowed(e, str(lib / "libvulkan.so.1.9"))
    assert not p.library_allowed(e, "libvulkan.so.1")  # relative
    assert not p.library_allowed(e, f"{lib}/libvulkan.so.1\x00")


def test_library_star_does_not_cross_directories(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "libx.so").write_bytes(b"")
    (tmp_path / "liby.so").write_bytes(b"")
    p = _lib_policy(tmp_path, f"{tmp_path}/*.so")
    e = p.programs[0]
    assert p.library_allowed(e, str(tmp_path / "liby.so"))
    assert not p.library_allowed(e, str(tmp_path / "sub" / "libx.so"))


def test_library_pattern_through_symlinked_dir(tmp_path):
    real_dir = tmp_path / "usr-lib"
    real_dir.mkdir()
    (real_dir / "libz.so.1").write_bytes(b"")
    (tmp_path / "lib").symlink_to(real_dir)
    # The admin wrote the merged-/usr alias; the target resolves to the real dir.
    p = _lib_policy(tmp_path, f"{tmp_path}/lib/libz.so.*")
    e = p.programs[0]
    assert p.library_allowed(e, str(real_dir / "libz.so.1"))
    # An exact (glob-free) pattern naming a symlink allows its target.
    (real_dir / "libz.so").symlink_to("libz.so.1")
    p = _lib_policy(tmp_path, f"{real_dir}/libz.so")
    assert p.library_allowed(p.programs[0], str(real_dir / "libz.so"))


def test_no_libraries_no_uprobes(policy):
    assert not policy.library_allowed(policy.programs[0], "/usr/lib/libc.so.6")


def test_functions(policy):
    ucalls = policy.programs[3]
    assert policy.function_allowed(ucalls, "vkQueueSubmit")
    assert not policy.function_allowed(ucalls, "malloc")
    assert policy.function_allowed(policy.programs[0], "anything")


# ---------------------------------------------------------------- tls clients, warnings


def test_tls_clients():
    p = Policy.parse(
        f"""
[[tls_client]]
subject_cn = "ci-runner"
user = "alice"

[[tls_client]]
cert_sha256 = "{":".join(["AB"] * 32)}"
user = 2000
""",
        resolver=FakeResolver(),
    )
    assert p.tls_user(subject_cn="ci-runner") == 1001
    assert p.tls_user(subject_cn="other", cert_sha256="ab" * 32) == 2000
    assert p.tls_user(subject_cn="other") is None


def test_tls_client_errors():
    errs = _errors('[[tls_client]]\nuser = "*"\nextra = 1\n')
    text = "\n".join(errs)
    assert "[[tls_client]] #1: field 'extra': unknown key" in text
    assert "[[tls_client]] #1: needs subject_cn or cert_sha256" in text
    assert "[[tls_client]] #1: field 'user': \"*\" is not a user" in text


def test_check_warnings_and_summary():
    p = Policy.parse(
        f"""
[[program]]
name = "x"
sha256 = "{SHA_A}"
users = ["alice", "ghost"]
groups = ["nogroup-here"]

[[program]]
name = "y"
sha256 = "{SHA_B}"

[[program]]
name = "x"
sha256 = "{SHA_A}"
users = ["alice", "ghost"]
groups = ["nogroup-here"]
""",
        path="p.toml",
        resolver=FakeResolver(),
    )
    warnings = report.check_warnings(p)
    assert 'p.toml [[program]] #1 "x": field \'users\': no user "ghost" on this host (yet)' in (
        warnings
    )
    assert any('#1 "x": field \'groups\': no group "nogroup-here"' in w for w in warnings)
    assert 'p.toml [[program]] #2 "y": neither users nor groups: the entry admits nobody' in (
        warnings
    )
    assert 'p.toml [[program]] #3 "x": same as [[program]] #1' in warnings
    summary = report.summary(p)
    assert summary.startswith("p.toml: 3 [[program]] entries for 2 programs")
    assert "#2 y" in summary and "nobody" in summary
    assert "sessions_per_user=8" in summary
    assert not any("[limits]" in w for w in warnings)


def test_check_warnings_name_a_per_user_limit_above_its_total():
    p = Policy.parse(
        "[limits]\ngrpc_connections_per_user = 300\nsessions_per_user = 9\nsessions_total = 4\n",
        path="p.toml",
        resolver=FakeResolver(),
    )
    warnings = [w for w in report.check_warnings(p) if "[limits]" in w]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("p.toml [limits]: grpc_connections_per_user (300) is more")
    assert "one user can take every session" in warnings[1]


def test_catalog_warnings(policy):
    from types import SimpleNamespace as NS

    catalog = [
        NS(name="syscount", sha256=SHA_A.upper(), scopes=("self", "system")),
        NS(name="vmabind", sha256=SHA_C, scopes=("system",)),
    ]
    warnings = report.catalog_warnings(policy, catalog)
    assert warnings[0].startswith(
        f"policy.toml [[program]] #3 \"vmabind\": field 'sha256': the catalog's object has "
        f"sha256 {SHA_C}"
    )
    assert warnings[1] == (
        "policy.toml [[program]] #3 \"vmabind\": field 'scope': the catalog program supports "
        "only system, not self"
    )
    assert warnings[2].startswith('policy.toml [[program]] #4 "ucalls": no program "ucalls"')
    assert len(warnings) == 3


def test_policy_file_in_deploy_example_if_present():
    # deploy/policy.example.toml (if the deploy task wrote one) must stay valid.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "deploy", "policy.example.toml")
    if not os.path.exists(path):
        pytest.skip("no deploy/policy.example.toml yet")
    Policy.load(path)


# ---------------------------------------------------------------- what a refused caller is told


@pytest.mark.parametrize(
    ("uid", "gids", "name", "sha", "scope", "ref"),
    [
        (1001, [], "foo", SHA_A, "self", "default deny"),
        (1003, [1003], "syscount", SHA_A, "self", "default deny"),
        (1002, [], "ucalls", SHA_A, "self", '[[program]] #4 "ucalls": sha256'),
        (1001, [], "syscount", SHA_A, "system", '[[program]] #1 "syscount": scope'),
        (1001, [], None, "d" * 64, "self", "default deny"),
    ],
)
def test_denials_tell_the_caller_a_reference_not_the_rule(policy, uid, gids, name, sha, scope, ref):
    d = policy.decide(uid, gids, name, sha, scope)
    assert not d.allowed and d.ref == ref and d.reason
    told = d.reason + d.ref
    # Other principals, the policy's path and the entry's hash stay in d.rule (the audit log).
    others = [n for n, u in FakeResolver.users.items() if u != uid] + ["1004", "video"]
    assert not [o for o in others if o in told], told
    assert "policy.toml" not in told and SHA_C not in told and "users =" not in told


def test_library_named_is_lexical(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "link").symlink_to(lib)
    p = _lib_policy(tmp_path, f"{tmp_path}/link/*.so")
    e = p.programs[0]
    # Matched as written, or with the glob's leading directories resolved; nothing
    # is looked up, so a file that does not exist matches alike.
    assert p.library_named(e, f"{tmp_path}/link/missing.so")
    assert p.library_named(e, f"{lib}/missing.so")
    assert not p.library_named(e, f"{tmp_path}/other/missing.so")
    assert not p.library_named(e, f"{lib}/../lib/x.so")  # not plain
    assert not p.library_named(e, f"{lib}/./x.so")
    assert not p.library_named(e, "x.so")


def test_an_entry_that_names_someone_else_is_refused_like_no_entry(policy):
    """No oracle of the policy (issue #26 item 12): what a caller no entry admits is
    told is the same whether entries for the program exist or not; the audit rule
    tells them apart."""
    exists = policy.decide(1003, [1003], "syscount", SHA_A, "self")
    absent = policy.decide(1003, [1003], "nosuchprogram", SHA_A, "self")
    wrong_hash = policy.decide(1003, [1003], "syscount", "d" * 64, "self")
    for d in (exists, absent, wrong_hash):
        assert not d.allowed and d.ref == "default deny"
        assert DENIAL_CODES[d.refusal] == DENIAL_CODES[absent.refusal]
    assert exists.reason == wrong_hash.reason == absent.reason.replace("nosuchprogram", "syscount")
    assert "users = " in exists.rule and "names" in absent.rule  # the audit keeps the detail
    upload_approved = policy.decide(1003, [1003], None, SHA_A, "self")
    upload_unknown = policy.decide(1003, [1003], None, "d" * 64, "self")
    assert upload_approved.reason == upload_unknown.reason
    assert upload_approved.refusal == upload_unknown.refusal
