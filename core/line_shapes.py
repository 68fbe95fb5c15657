"""What a log line says, apart from what carried it: the wrapper a log store put around it and the head a launcher
put in front of it.

Rules are written against lines as a program prints them, and some read a line's start: a traceback's header, a
py-spy frame, nccl-tests' table, Horovod's stall report. Lines rarely reach Argus that bare:

- **Wrappers** are no part of the line: a terminal's or Ray's colours (ANSI escapes, also in the middle of a
  word) and the JSON a log store keeps each line in (Docker's json-file driver: {"log": ..., "time": ...};
  structured loggers: "message", "msg", "text", "event"). `unwrap` removes them for the rules to read the line;
  evidence keeps the line as written (a Ray event's JSON names the node in fields its message may not).
- **HTML escapes** are no part of it either: a log copied out of a web page's source or an HTML mail reads
  "-&gt; 2" and "&lt;/dev/shm/x&gt;". `unwrap` decodes the few entities such a copy holds (&lt; &gt; &amp; &quot;
  &#39; and numeric ones that are no control character); a lone "&" or a URL's "&notify=" stays as it is.
- **Typography** a web page, a chat or a word processor put in is read as the plain characters rules are written
  with: no-break and other Unicode spaces as a space, zero-width ones as nothing, curly quotes as straight ones.
- **Heads** are part of the line: the time a container runtime or kubectl --timestamps wrote ("2024-05-01T10:00:00
  .123456789Z stderr F "), a syslog / journald header ("May  1 10:00:00 gpu-3 python[42]: "), Ray's worker prefix
  ("(RayTrainWorker pid=42, ip=10.0.0.7) ") and SkyPilot's ("(worker1, rank=1, pid=42, ip=10.0.0.7) "), torchrun's
  ("[rank3]:", "[default3]:"), the rank srun -l, horovodrun and mpirun --tag-output print ("3: ", "[3] ",
  "[1,3]<stderr>:"), the host pdsh prints ("10.0.0.7: ", "node-03: "), the pod kubectl logs --prefix prints
  ("[pod/trainer-0/pytorch] "), docker compose's service ("trainer-1  | ") and grep's file and line
  ("logs/worker-3.log:1234:", from grep -Hn over a job's logs). Times are read from them (core.line_time), so they
  stay in the line as written; `body` is the line without them, which is what rules read
  (detectors.engine.rule_text).

Ray's system prefixes ("(raylet)", "(gcs_server)", "(pid=raylet)") are no head: rules read them to tell a raylet's
line from a worker's, and they carry no pid number.

A log pasted where people talk about it (an issue, a chat, a mail) gains a **quote** in front of every line: the
markdown and mail marker "> ", nested as "> > ", and sometimes an indent (a markdown code block is indented by four
spaces). `body` drops the quote markers, and an indent in front of a head; an indent in front of the program's own
words stays, since it is part of them (a traceback's frames and source lines are told apart by it). Rules read the
line without it (detectors.engine.rule_text).
"""

from __future__ import annotations

import json
import re

# CSI sequences (colours, cursor moves) and the two-character escapes (charset selection, keypad modes).
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[()][A-Za-z0-9]|[=>])")
_ANSI_BYTES = re.compile(_ANSI.pattern.encode())
# The HTML entities a log copied out of a page's source holds; each decodes to one printable character.
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|apos|#\d{1,7}|#[xX][0-9a-fA-F]{1,6});")
_ENTITY_BYTES = re.compile(_ENTITY.pattern.encode())
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
# What a web page, a chat or a word processor puts in place of plain characters: no-break and other wide or narrow
# spaces (a page's &nbsp;), zero-width ones, and curly quotes. Rules are written with the plain ones.
_SPACES = "\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
_PLAIN = {
    **{ord(c): " " for c in _SPACES},
    **{ord(c): None for c in "\u200b\u200c\u200d\u2060\ufeff"},
    **{ord(c): "'" for c in "\u2018\u2019\u201a\u201b\u2032"},
    **{ord(c): '"' for c in "\u201c\u201d\u201e\u201f\u2033"},
}
_PLAIN_BYTES = {chr(code).encode(): (plain or "").encode() for code, plain in _PLAIN.items()}
_TYPOGRAPHY_BYTES = re.compile(b"|".join(re.escape(raw) for raw in _PLAIN_BYTES))
# A line that may be a JSON record: an object whose first key is quoted ('{"'). Python's dict reprs ("{'loss': 0.5}"),
# which trainers print by the thousand, are not tried: a failed parse per such line would cost more than the scan.
_RECORD = re.compile(r'^\{[^\S\n]*"[^\n]*\}[^\S\n]*$', re.MULTILINE)
_RECORD_BYTES = re.compile(_RECORD.pattern.encode(), re.MULTILINE)
# Where a structured line keeps its text and its time, in the order looked for. "log": Docker's json-file and
# Fluent Bit; "message"/"msg": Python JSON loggers, Go's slog and logrus, Kubernetes' klog -json; "text": loguru's
# serialize=True (the formatted line); "event": structlog; "MESSAGE": journalctl -o json.
_TEXT_KEYS = ("log", "message", "msg", "text", "event", "MESSAGE")
_TIME_KEYS = ("time", "timestamp", "@timestamp", "ts", "asctime")
# A traceback a structured logger keeps apart from the message.
_TRACE_KEYS = ("exception", "exc_info", "stack_trace", "stack")
_HEAD = re.compile(
    r"(?:"
    # journalctl -o short-iso / short-iso-precise: an RFC 3339 time, the host, the program and its pid
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d) [\w.-]{1,64} [\w./@-]{1,64}\[\d{1,10}\]: "
    # RFC 3339 with a zone: the CRI log format (+ stream, + full/partial tag), kubectl logs --timestamps
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d) (?:(?:stdout|stderr) [FP] )?"
    # syslog / journald: month day time host ident[pid]:
    r"|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d [\w.-]{1,64} [\w./@-]{1,64}"
    r"(?:\[\d{1,10}\])?: "
    # Ray's worker prefix: "(pid=42)", "(pid=42, ip=10.0.0.7)", "(RayTrainWorker pid=42, ip=..., actor_id=...)";
    # SkyPilot's, which names the node first: "(head, rank=0, pid=42)", "(worker1, rank=1, pid=42, ip=10.0.0.7)",
    # "(setup pid=42)", "(task-name, pid=42)"
    r"|\((?:[\w.:<>-]{1,100},? )?(?:[a-z_]{1,20}=[^,()\n]{1,100}, ){0,4}"
    r"pid=\d{1,10}(?:, [a-z_]{1,20}=[^,()\n]{1,100}){0,4}\) "
    # torchrun's --log-line-prefix / tee prefixes; Determined's wrap_rank ("[rank=3] ")
    r"|\[(?:rank|default)\d{1,6}\]: ?|\[rank=\d{1,6}\] "
    # mpirun --tag-output ("[1,3]<stderr>:"), Horovod's own launcher ("[3]<stderr>:", "[3] ")
    r"|\[\d{1,6}(?:,\d{1,6})?\]<std(?:out|err)>: ?|\[\d{1,6}\] "
    # srun -l, horovodrun: the rank
    r"|\d{1,6}: "
    # pdsh (DeepSpeed's multi-node launcher): the host, by address or by a name that ends in "-<number>"
    # ("worker-0", "gpu-node-3", "ip-10-0-0-7"); a bare "node1: " is no different from a driver's "mlx5: ".
    r"|(?:\d{1,3}\.){3}\d{1,3}: |[a-z][a-z0-9]{0,30}(?:-[a-z0-9]{1,30}){0,6}-[a-z]{0,8}\d{1,4}: "
    # kubectl logs --prefix (several pods or containers at once): "[pod/<pod>/<container>] "
    r"|\[pod/[\w.-]{1,253}/[\w.-]{1,63}\] "
    # docker compose logs: the service's container, padded, then "| "
    r"|[a-z0-9][\w.-]{0,62}[-_]\d{1,3} {0,30}\| "
    # grep -H / -n / -Hn (":" on a matching line, "-" on a context line): a log file's path, a line number, or
    # both; a number without a path is one only when no digit follows ("10:00:00" is a time, not line 10)
    r"|(?:[\w.@~+-]{0,200}/){0,20}[\w.@+-]{1,200}\.(?:log|txt|out|err|jsonl?)(?:\.\d{1,3})?[:-](?:\d{1,9}[:-])?"
    r"|\d{1,9}[:-](?![\d ])"
    # cat -n, less -N: the line's number (after the indent that right-aligns it) and a tab
    r"|\d{1,9}\t"
    r")"
)
_MAX_HEADS = 5  # "node-3: [rank0]: ..." nests a few; a line is never all heads
# Markdown's and mail's quote markers: up to three spaces, then ">" and one optional space, nested as "> > " or ">>".
_QUOTE = re.compile(r"[ \t]{0,3}>(?:[ \t]?>)*[ \t]?")
_INDENT = re.compile(r"[ \t]{1,16}")


def unwrap(line: str) -> str:
    """The line without its wrapper: ANSI escapes removed, a structured (JSON) line as its time and text, HTML
    entities decoded, a web page's or a chat's typography made plain."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if line.startswith("{") and _RECORD.match(line):
        line = _structured(line)
    if "&" in line:
        line = _ENTITY.sub(_decode_entity, line)
    if not line.isascii():
        line = line.translate(_PLAIN)
    return line


def unwrap_block(block: bytes) -> bytes:
    """`unwrap` on every line of a block of a byte stream, keeping its lines (one out for each in, the same
    newlines), so line numbers stay those of the file. Blocks with nothing to unwrap come back as they are."""
    if b"\x1b" in block:
        block = _ANSI_BYTES.sub(b"", block)
    if b'{"' in block or b'{ ' in block:
        pieces, done = [], 0
        for record in _RECORD_BYTES.finditer(block):
            text = record.group().decode("utf-8", errors="replace")
            plain = _structured(text)
            if plain is not text:
                pieces += [block[done : record.start()], plain.encode("utf-8", errors="replace")]
                done = record.end()
        if pieces:
            block = b"".join([*pieces, block[done:]])
    if b"&" in block and _ENTITY_BYTES.search(block):
        block = _ENTITY_BYTES.sub(lambda m: _decode_entity(m).encode("utf-8"), block)
    if not block.isascii() and _TYPOGRAPHY_BYTES.search(block):
        block = _TYPOGRAPHY_BYTES.sub(lambda m: _PLAIN_BYTES[m.group()], block)
    return block


def _decode_entity(entity: re.Match[str] | re.Match[bytes]) -> str:
    """The character an HTML entity stands for; the entity itself when it stands for a control character (a newline
    decoded would split the line) or for no character at all."""
    raw = entity.group()
    name = (raw.decode("ascii") if isinstance(raw, bytes) else raw)[1:-1]
    if name in _NAMED:
        return _NAMED[name]
    code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
    if code < 0x20 or 0x7F <= code < 0xA0 or code > 0x10FFFF or 0xD800 <= code < 0xE000:
        return name.join("&;")
    return chr(code)


def body(line: str) -> str:
    """The line after its quote markers and its heads (timestamps a log store wrote, a syslog header, Ray's worker
    prefix, a rank or a host a launcher printed), with any indent in front of a head; the line itself when it has
    none."""
    quote = _QUOTE.match(line) if line[:4].lstrip(" \t").startswith(">") else None
    start = quote.end() if quote else 0
    for _ in range(_MAX_HEADS):
        indent = _INDENT.match(line, start)
        head = _HEAD.match(line, indent.end() if indent else start)
        if head is None or head.end() == start:
            break
        start = head.end()
    return line[start:] if start else line


def _structured(line: str) -> str:
    """A JSON object's text (and time) as one line; the line itself when it is not a structured log line."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes: a line like any other
        return line
    if not isinstance(record, dict):
        return line
    text = next((record[k] for k in _TEXT_KEYS if isinstance(record.get(k), str)), None)
    if text is None:
        return line
    trace = next((record[k] for k in _TRACE_KEYS if isinstance(record.get(k), str) and record[k]), None)
    if trace:
        text = f"{text} {trace}"
    # One line in, one line out: a record holding a whole traceback is read as one line.
    text = " ".join(text.splitlines()) if "\n" in text or "\r" in text else text
    when = next((record[k] for k in _TIME_KEYS if isinstance(record.get(k), str)), None)
    return f"{when} {text}" if when else text
