"""core.line_shapes: a log line's wrapper (colours, a log store's JSON) and its heads (a runtime's time, syslog, Ray's
worker prefix, a launcher's rank or host), on the shapes real collectors write and on hostile input."""

from __future__ import annotations

import json

import pytest

from core.line_shapes import body, unwrap, unwrap_block
from tests.cost import assert_linear

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(
    ("wrapped", "plain"),
    [
        ("\x1b[36m(TaskRunner pid=2)\x1b[0m step:1", "(TaskRunner pid=2) step:1"),
        ("\x1b[1m\x1b[31mCUDA\x1b[0m out of \x1b[4mmemory\x1b[24m", "CUDA out of memory"),
        ("\x1b(Bplain\x1b=", "plain"),
        # Docker's json-file driver: the text without its newline, after the time it was written
        (json.dumps({"log": OOM + "\n", "stream": "stderr", "time": "2024-05-01T10:00:00.1Z"}),
         f"2024-05-01T10:00:00.1Z {OOM}"),
        # structured loggers: their text keys; a traceback kept apart is read with the message, on one line
        (json.dumps({"level": "error", "msg": "step failed"}), "step failed"),
        (json.dumps({"event": "crash", "exception": "Traceback (most recent call last):\n  File \"x\"\nKeyError: 'a'"}),
         "crash Traceback (most recent call last):   File \"x\" KeyError: 'a'"),
        (json.dumps({"text": "2024-05-01 10:00:00 | ERROR | boom\n", "record": {"level": "ERROR"}}),
         "2024-05-01 10:00:00 | ERROR | boom"),
    ],
)
def test_unwrap_removes_what_carried_the_line(wrapped: str, plain: str) -> None:
    assert unwrap(wrapped) == plain


@pytest.mark.parametrize(
    ("escaped", "plain"),
    [
        ("misc/socket.cc:50 -&gt; 2", "misc/socket.cc:50 -> 2"),
        ("unable to write to file &lt;/torch_1_2&gt;: No space", "unable to write to file </torch_1_2>: No space"),
        ("KeyError: &#39;a&#39; &quot;b&quot; &apos;c&apos; &#x41;", "KeyError: 'a' \"b\" 'c' A"),
        ("&amp;lt; is decoded once", "&lt; is decoded once"),
        # no control character comes out of an entity: a decoded newline would split the line
        ("one&#10;line&#13;&#0;&#x7f;", "one&#10;line&#13;&#0;&#x7f;"),
        ("beyond unicode &#99999999; &#xD800;", "beyond unicode &#99999999; &#xD800;"),
        # what is no entity: a lone ampersand, a URL's query, a name without its semicolon
        ("a & b ?x=1&notify=2 &lt &copy;", "a & b ?x=1&notify=2 &lt &copy;"),
    ],
)
def test_unwrap_decodes_the_entities_of_a_log_copied_out_of_html(escaped: str, plain: str) -> None:
    assert unwrap(escaped) == plain
    assert unwrap_block(escaped.encode() + b"\n") == plain.encode() + b"\n"


@pytest.mark.parametrize(
    ("typed", "plain"),
    [
        ("CUDA\u00a0out\u00a0of\u00a0memory.", "CUDA out of memory."),  # a rendered page's &nbsp;
        ("No\u202fspace\u2009left\u3000on device", "No space left on device"),
        ("Cuda failure \u2018out of memory\u2019", "Cuda failure 'out of memory'"),
        ("KeyError: \u201cmodel\u201d", 'KeyError: "model"'),
        ("zero\u200bwidth\ufeff", "zerowidth"),
        ("loss 0.5 \u2588\u2588 \u4e2d\u6587 \u00e9", "loss 0.5 \u2588\u2588 \u4e2d\u6587 \u00e9"),  # other text stays
    ],
)
def test_unwrap_reads_a_pages_or_a_chats_typography_as_plain_characters(typed: str, plain: str) -> None:
    assert unwrap(typed) == plain
    assert unwrap_block(typed.encode() + b"\n" + typed.encode()) == (plain + "\n" + plain).encode()


@pytest.mark.parametrize(
    "line",
    [
        "{'loss': 0.52, 'learning_rate': 1e-05}",  # a Python dict printed by a trainer
        '{"loss": 0.52}',  # JSON without a text: metrics, not a log line
        '{"log": 7}',
        '{"log": "unterminated',
        "[1, 2, 3]",
        "{" + "[" * 5000 + "}",  # nested too deep for a parser: stays what it is
        "plain line",
    ],
)
def test_unwrap_leaves_lines_that_are_no_wrapper_alone(line: str) -> None:
    assert unwrap(line) == line


def test_unwrap_block_keeps_every_line_and_its_number() -> None:
    lines = [
        "\x1b[31mred\x1b[0m",
        json.dumps({"log": "first\nsecond\n", "time": "2024-05-01T10:00:00Z"}),  # one record, one line
        "{not json}",
        "",
        "tail",
    ]
    block = ("\n".join(lines) + "\n").encode()
    out = unwrap_block(block)
    assert out.count(b"\n") == block.count(b"\n")
    assert out.decode().split("\n")[:-1] == [unwrap(line) for line in lines]
    plain = b"nothing to unwrap here\n{'a': 1}\n"
    assert unwrap_block(plain) is plain


@pytest.mark.parametrize(
    ("line", "rest"),
    [
        ("2024-05-01T10:00:00.123456789Z stderr F Traceback (most recent call last):",
         "Traceback (most recent call last):"),
        ("2024-05-01T10:00:00+08:00 KeyError: 'a'", "KeyError: 'a'"),
        ("May  1 10:00:00 gpu-node-3 python[4242]: Traceback", "Traceback"),
        ("(RayTrainWorker pid=1234, ip=10.0.0.7) Traceback", "Traceback"),
        ("(pid=1234) Traceback", "Traceback"),
        ("(WorkerDict pid=9, ip=10.0.0.1, actor_id=abc, repr=<Worker>) x", "x"),
        ("[rank3]: Traceback", "Traceback"),
        ("[default0]:Traceback", "Traceback"),
        ("[1,3]<stderr>:Traceback", "Traceback"),
        ("3: Traceback", "Traceback"),
        ("10.0.0.7: Traceback", "Traceback"),
        ("worker-0: Traceback", "Traceback"),
        ("ip-10-0-0-7: Traceback", "Traceback"),
        # nested heads, as Ray on Kubernetes writes a torchrun worker's line
        ("2024-05-01T10:00:00Z stdout F (TaskRunner pid=9, ip=10.0.0.8) [rank0]: Traceback", "Traceback"),
        # SkyPilot's node prefix, Horovod's and Determined's rank
        ("(head, rank=0, pid=2494) Traceback", "Traceback"),
        ("(worker1, rank=1, pid=2345, ip=10.0.0.2) Traceback", "Traceback"),
        ("(worker2, rank=2, ip=10.0.0.3, pid=2345) Traceback", "Traceback"),
        ("(setup pid=8665) Traceback", "Traceback"),
        ("(sft-job, pid=8665) Traceback", "Traceback"),
        ("[0]<stderr>:Traceback", "Traceback"),
        ("[3] Traceback", "Traceback"),
        ("[rank=3] Traceback", "Traceback"),
        # journalctl -o short-iso, kubectl logs --prefix, docker compose logs
        ("2024-05-01T10:00:00+0000 gpu-node-3 python[4242]: Traceback", "Traceback"),
        ("2024-05-01T10:00:00.123456+08:00 gpu-3 kernel[0]: NVRM: Xid", "NVRM: Xid"),
        # without a program[pid] it is kubectl's time: the words after it are the program's, not a host's
        ("2024-05-01T10:00:00Z NCCL error: unhandled system error", "NCCL error: unhandled system error"),
        ("[pod/trainer-worker-0/pytorch] Traceback", "Traceback"),
        ("trainer-1  | Traceback", "Traceback"),
        ("verl_trainer_1 | [rank0]: Traceback", "Traceback"),
        # grep over a job's logs (-H, -n, -Hn; "-" on context lines) and a pager's line numbers (cat -n)
        ("logs/worker-3.log:1234:Traceback", "Traceback"),
        ("/tmp/ray/session_latest/logs/raylet.out:(raylet) x", "(raylet) x"),
        ("job-driver-raysubmit_1.log-17-Traceback", "Traceback"),
        ("train.log:Traceback", "Traceback"),
        ("1234:Traceback", "Traceback"),
        ("1234-Traceback", "Traceback"),
        ("    12\tTraceback", "Traceback"),
        # a log pasted into an issue or a mail: quote markers, nested, and an indent in front of a head
        ("> Traceback", "Traceback"),
        ("> > [rank3]: Traceback", "Traceback"),
        (">> KeyError: 'a'", "KeyError: 'a'"),
        ("   > x", "x"),
        (">", ""),
        ("    2024-05-01T10:00:00Z stderr F [rank1]: Traceback", "Traceback"),
        ("> \t(pid=1234) Traceback", "Traceback"),
        # a quoted frame keeps its own indent: frames and their source lines are told apart by it
        ('>   File "train.py", line 3, in <module>', '  File "train.py", line 3, in <module>'),
    ],
)
def test_body_is_the_line_after_its_heads(line: str, rest: str) -> None:
    assert body(line) == rest


@pytest.mark.parametrize(
    "line",
    [
        "(raylet) Raylet is terminated",  # Ray's system processes: rules read these
        "(pid=raylet) [2021-01-01 00:00:00] x",
        "(gcs_server) health check failed",
        "mlx5: host_unknown: got completion with error:",  # a driver's name, not a host
        "node1: anything",  # a host name without "-<number>" is no different
        "RuntimeError: CUDA error",
        "2024-05-01 10:00:00,123 INFO x",  # a logger's own time is the program's line
        "[2024-05-01 10:00:00,123] [ERROR] x",
        "",
        "    raise ValueError(x)",  # an indent in front of the program's own words is part of them
        '  File "train.py", line 3, in <module>',
        "-> 2",
        "a > b",
        "    > four spaces make a code block, not a quote",
        "10:00:00 a clock time is no line number",
        "12-05 10:00 nor a date",
        "3:1 ratio",
        "ERROR    | __main__:main:5 - a loguru level is no compose service",
        "torch.log is a word, not a grep head",
        "[0, 1] a list is no rank",
        "(pid) no number",
    ],
)
def test_body_keeps_what_is_no_head(line: str) -> None:
    assert body(line) is line


def test_body_and_unwrap_stay_linear_on_hostile_lines() -> None:
    assert_linear(body, lambda n: "1: " * n, 20_000)
    assert_linear(body, lambda n: "(pid=1" + ", a=b" * n, 20_000)
    assert_linear(unwrap, lambda n: "\x1b[" * n, 20_000)
    assert_linear(unwrap, lambda n: '{"log": "' + "\\n" * n + '"}', 20_000)
    assert_linear(body, lambda n: "> " * n, 20_000)
    assert_linear(body, lambda n: " " * n + "x", 20_000)
    assert_linear(body, lambda n: "    1: " * n, 20_000)
    assert_linear(body, lambda n: "a/" * n + "x.log:", 20_000)
    assert_linear(body, lambda n: "a." * n + "log:", 20_000)
    assert_linear(body, lambda n: "x-1" + " " * n + "| ", 20_000)
    assert_linear(body, lambda n: "(a, " + "k=v, " * n + "pid=1) ", 20_000)
    assert_linear(unwrap, lambda n: "&lt;" * n, 20_000)
    assert_linear(unwrap, lambda n: "&#" + "9" * n + ";", 20_000)
    assert_linear(unwrap, lambda n: "\u00a0\u2019" * n, 20_000)
    assert_linear(unwrap_block, lambda n: "\u00a0\u200b\n".encode() * n, 20_000)
    assert body("1: " * 1000).startswith("1: ")  # a few heads are looked past, not a line made of them
