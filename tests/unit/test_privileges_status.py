"""Parsing /proc/<pid>/status and judging the capability state (no privileges needed)."""

from __future__ import annotations

import os

import pytest

from gfxbpf.broker import privileges
from gfxbpf.broker.privileges import BROKER_CAPS_MASK, CapState, PrivilegeError

GOOD = """Name:\tgfxbpf-broker
Umask:\t0022
Uid:\t999\t999\t999\t999
Gid:\t998\t998\t998\t998
Groups:\t
NoNewPrivs:\t1
CapInh:\t0000000000000000
CapPrm:\t000000c000000000
CapEff:\t000000c000000000
CapBnd:\t000000c000000000
CapAmb:\t0000000000000000
Seccomp:\t0
"""


def test_mask_value():
    assert BROKER_CAPS_MASK == 0x000000C000000000
    assert privileges.cap_names(BROKER_CAPS_MASK) == ["cap_perfmon", "cap_bpf"]
    assert privileges.cap_name(21) == "cap_sys_admin"
    assert privileges.cap_name(55) == "cap_55"


def test_parse_good_state():
    st = privileges.parse_status(GOOD)
    assert st == CapState(
        eff=BROKER_CAPS_MASK,
        prm=BROKER_CAPS_MASK,
        inh=0,
        bnd=BROKER_CAPS_MASK,
        amb=0,
        no_new_privs=True,
        uids=(999, 999, 999, 999),
        gids=(998, 998, 998, 998),
        groups=(),
    )
    assert privileges.state_problems(st) == []


def test_problems_name_each_difference():
    text = (
        GOOD.replace("CapEff:\t000000c000000000", "CapEff:\t000000c000200000")
        .replace("CapBnd:\t000000c000000000", "CapBnd:\t0000008000000000")
        .replace("CapAmb:\t0000000000000000", "CapAmb:\t0000004000000000")
        .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")
    )
    problems = privileges.state_problems(privileges.parse_status(text))
    assert problems == [
        "CapEff is 000000c000200000, not 000000c000000000 (also holds cap_sys_admin)",
        "CapBnd is 0000008000000000, not 000000c000000000 (lacks cap_perfmon)",
        "CapAmb is 0000004000000000, not 0 (cap_perfmon)",
        "NoNewPrivs is 0, not 1",
    ]


def test_parse_rejects_garbage():
    with pytest.raises(PrivilegeError, match="cannot parse"):
        privileges.parse_status("Name:\tx\n")
    with pytest.raises(PrivilegeError, match="cannot parse"):
        privileges.parse_status(GOOD.replace("CapPrm:\t000000c000000000", "CapPrm:\tzz"))


def test_read_own_status():
    st = privileges.read_status()
    assert st.uids[0] == os.getuid()
    assert isinstance(st.bnd, int) and st.bnd > 0


def test_report_summary():
    st = privileges.parse_status(GOOD)
    rep = privileges.PrivilegeReport(
        uid=999, gid=998, user="gfxbpf", switched_user=True, state=st, dropped=("cap_chown",)
    )
    text = rep.summary()
    assert text.startswith("uid 999 (gfxbpf) gid 998: capabilities cap_perfmon,cap_bpf")
    assert "NoNewPrivs 1" in text and "switched from root" in text
