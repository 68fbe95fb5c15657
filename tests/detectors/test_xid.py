"""The Xid catalog and the kernel-line parser. Nothing here is simulated: kernel lines are as quoted in public
bug reports and health-check code (gists of `dmesg` after Xid 79, an Ansible ECC check's output, NVIDIA
driver forums), and the rule files are the shipped ones."""

import re

import pytest

from detectors import xid
from detectors.metric_rules import load_metric_rules
from detectors.xid import XidClass, codes, describe, lookup, parse_kernel_xid


def rule_codes(reason: str) -> frozenset[int]:
    rule = load_metric_rules().get(reason)
    assert rule is not None and rule.xid
    return frozenset(int(c) for c in re.findall(r"DCGM_FI_DEV_XID_ERRORS\s*==\s*(\d+)", rule.expr))


@pytest.mark.parametrize(
    ("reason", "xid_class"),
    [
        ("GpuXidDrainAndReset", XidClass.DRAIN_AND_RESET),
        ("GpuXidApplicationError", XidClass.APPLICATION),
        ("GpuXidWatch", XidClass.INVESTIGATE),
    ],
)
def test_shipped_xid_rules_cover_exactly_their_catalog_class(reason, xid_class):
    assert rule_codes(reason) == codes(xid_class)


def test_catalog_follows_nvidia_on_the_codes_that_matter_most():
    for code in (48, 64, 74, 79, 95, 119, 120, 140):
        assert lookup(code).xid_class is XidClass.DRAIN_AND_RESET, code
    for code in (13, 31, 43, 45):
        assert lookup(code).xid_class is XidClass.APPLICATION, code
        assert not lookup(code).hardware
    # Contained or self-repaired memory events: the GPU stays in service, but they are hardware.
    for code in (63, 92, 94):
        assert lookup(code).xid_class is XidClass.INVESTIGATE and lookup(code).hardware
    assert lookup(79).nvidia_action == "RESTART_BM" and "reboot" in lookup(79).action
    assert all("drain" in lookup(c).action.lower() for c in codes(XidClass.DRAIN_AND_RESET))
    assert codes(XidClass.DRAIN_AND_RESET).isdisjoint(codes(XidClass.APPLICATION))


def test_describe_names_code_meaning_and_class():
    assert describe(79) == "Xid 79 (GPU has fallen off the bus; hardware: drain and reset)"
    assert describe(13) == "Xid 13 (Graphics Engine Exception; application error, not hardware)"
    assert "not in Argus's catalog" in describe(9999) and xid.CATALOG_URL in describe(9999)


@pytest.mark.parametrize(
    ("line", "pci", "code", "pid", "process", "message"),
    [
        (
            "Sep 09 15:53:19 saturn kernel: NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus.",
            "0000:10:00", 79, "0", None, "GPU has fallen off the bus.",
        ),
        (
            "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
            "0000:2b:00", 79, None, None, "GPU has fallen off the bus.",
        ),
        (
            "[Sun Aug 25 20:10:45 2024] NVRM: Xid (PCI:0000:2a:00): 140, pid='<unknown>', name=<unknown>, "
            "An uncorrectable ECC error detected (possible firmware handling failure) DRAM:0, LTC:0, MMU:0, PCIE:0",
            "0000:2a:00", 140, "<unknown>", "<unknown>",
            "An uncorrectable ECC error detected (possible firmware handling failure) DRAM:0, LTC:0, MMU:0, PCIE:0",
        ),
        (
            "kernel: [16450076.435595] NVRM: Xid (PCI:0001:00:00): 31, pid=2079991, name=pt_main_thread, "
            "Ch 00000007, intr 00000000",
            "0001:00:00", 31, "2079991", "pt_main_thread", "Ch 00000007, intr 00000000",
        ),
        (
            "[ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
            "0000:01:00", 3, None, None, "C 00000005 SC 00000007 M 00001ffc Data ffffffff",
        ),
        (
            "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, "
            "Row Remapper: New row marked for remapping, reset gpu to activate.",
            "0000:10:1c", 63, "1896", None, "Row Remapper: New row marked for remapping, reset gpu to activate.",
        ),
    ],
)
def test_kernel_xid_lines_parse(line, pci, code, pid, process, message):
    parsed = parse_kernel_xid(line)
    assert parsed is not None
    assert (parsed.pci, parsed.code, parsed.pid, parsed.process, parsed.message) == (pci, code, pid, process, message)


def test_lines_without_an_xid_are_not_parsed():
    assert parse_kernel_xid("NVRM: GPU at PCI:0000:01:00: GPU-926ecdb0-adb1-6ee9-2fad-52e7214c5011") is None
    assert parse_kernel_xid("NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.") is None
    assert parse_kernel_xid("training step 79, loss 1.2") is None
    long = parse_kernel_xid("NVRM: Xid (PCI:0000:2b:00): 79, " + "x" * 10_000)
    assert long.code == 79 and len(long.message) <= 2000  # bounded, whatever the line
