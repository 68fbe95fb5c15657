"""The Ray node a log line or a job message names as the place a fault happened.

One host fault is seen from several places: the GCS on the head logs a worker's OOM kill or death
("Reporting worker exit, ..., node id = <id>, address = <ip>, exit_type = NODE_OUT_OF_MEMORY"), the
job's driver prints the exception ("Memory on the node (IP: <ip>, ID: <id>) was ..."), and the raylet of
the node itself logs its advice. To be one incident they must agree on the node, and the writer of a
line is not always that node: the node is read from the text.

Only labelled ids count: a Ray worker id is 28 bytes like a node id, and the GCS names the worker before
the node, so a bare 56-hex-digit number is not taken for a node (except as log_rules' last resort for
node deaths, where Ray's older lines name the node unlabelled). The IP is kept where the text gives one
next to the node, checked as an address, so names read "node … (127.0.0.4)".

A Ray message spans lines: the GCS's report of an OOM kill names the node on its first, stamped line, lists the
top memory users on the next forty, and ends with Ray's advice, which names no node. `MessageHeads` keeps each
cluster log's last stamped line, so a continuation line that names no node is about the node its message named.
"""

from __future__ import annotations

import ipaddress
import re
from collections import OrderedDict
from dataclasses import dataclass

from core.line_time import line_time
from core.types import Category

# The categories whose fault lives on one host: a line about one of these that names a node is about that node.
NODE_SCOPED = frozenset({Category.HOST_OOM, Category.NODE_LOST, Category.GPU_HARDWARE})

_ID = r"([0-9a-fA-F]{56})(?![0-9a-zA-Z])"
_ADDRESS = r"([0-9A-Fa-f:.]{2,45}?)(?=[\s,;)\]]|$)"  # IPv4 or IPv6; validated by ipaddress below
# "(IP: 1.2.3.4, ID: <id>)" (memory monitor, job exception) and "(ID: <id>, IP: 1.2.3.4)" (raylet summary).
_IP_THEN_ID = re.compile(rf"\(IP: {_ADDRESS}, ID: {_ID}")
_ID_THEN_IP = re.compile(rf"\(ID: {_ID}, IP: {_ADDRESS}[,)]")
# "node id = <id>", "node_id=<id>", "Node ID: <id>", "NodeID: <id>" (GCS, raylet, actor death causes).
_LABELLED_ID = re.compile(rf"(?i:\bnode[ _]?id)\s{{0,3}}[=:]\s{{0,3}}{_ID}")
# The address beside a labelled node id: "address = 1.2.3.4", "node_ip_address=1.2.3.4", "IP: 1.2.3.4".
_LABELLED_IP = re.compile(rf"(?i:\b(?:node[ _])?(?:ip[ _]?address|address|ip))\s{{0,3}}[=:]\s{{0,3}}{_ADDRESS}")
# Ray lines are one record each; a longer text is not searched past this (hostile input stays cheap).
_SCAN_CHARS = 20_000


@dataclass(frozen=True)
class NamedNode:
    """A Ray node id (lower-case hex) and, where the text gave one beside it, its IP."""

    id: str
    ip: str | None = None


def node_named_in(text: str) -> NamedNode | None:
    """The node `text` names as where something happened, by a labelled id; None when it names none."""
    text = text[:_SCAN_CHARS]
    if found := _IP_THEN_ID.search(text):
        return NamedNode(found.group(2).lower(), _address(found.group(1)))
    if found := _ID_THEN_IP.search(text):
        return NamedNode(found.group(1).lower(), _address(found.group(2)))
    found = _LABELLED_ID.search(text)
    if found is None:
        return None
    ip = next((a for m in _LABELLED_IP.finditer(text) if (a := _address(m.group(1)))), None)
    return NamedNode(found.group(1).lower(), ip)


def _address(token: str) -> str | None:
    try:
        return str(ipaddress.ip_address(token))
    except ValueError:
        return None


class MessageHeads:
    """Per log source, the first line of the message its latest line belongs to: the last line with a time
    stamp of its own (Ray's `[2026-11-25 12:14:33,230 W ...]`, Python logging's). Bounded to `max_sources`."""

    def __init__(self, max_sources: int = 4096) -> None:
        self.max_sources = max_sources
        self._heads: OrderedDict[str, tuple[str, NamedNode | None, bool]] = OrderedDict()

    def see(self, source: str, text: str) -> bool:
        """Take `text` as the next line of `source`; True when it starts a message (it has its own stamp)."""
        if line_time(text) is None:
            return False
        self._heads[source] = (text, None, False)  # what it names is read when a continuation line asks
        self._heads.move_to_end(source)
        while len(self._heads) > self.max_sources:
            self._heads.popitem(last=False)
        return True

    def node_of(self, source: str) -> NamedNode | None:
        """The node the current message of `source` names on its first line, if it names one."""
        head = self._heads.get(source)
        if head is None:
            return None
        text, named, read = head
        if not read:
            named = node_named_in(text)
            self._heads[source] = (text, named, True)
        return named
