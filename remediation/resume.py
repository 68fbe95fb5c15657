"""How a resubmitted job resumes: find the trainer in its entrypoint, find the chain's latest checkpoint, and
tell the trainer about it the way that trainer takes it.

An entrypoint is a shell command the user wrote (`cd /nfs/x && python3 -m verl.trainer.main_ppo a=b ... 2>&1 |
tee train.log`). It is parsed as shell (bashlex), never edited as a string: the trainer's command is the one
that runs the trainer (see TRAINER_RULES), and what Argus adds goes right after that command's last word,
before its redirections and before any pipe, so `| tee log` or `> out` never swallow it. An argument the user
already gave for the same key is replaced in place, never given twice (Hydra would refuse that).

How each trainer takes a checkpoint (rules as data, TRAINER_RULES):
- verl (Hydra overrides; read in verl's ray_trainer.py `_load_checkpoint`): `trainer.resume_mode=resume_path`
  and `trainer.resume_from_path=<.../global_step_N>`; verl sets its global step from that folder's name. Its
  checkpoints live in `trainer.default_local_dir` (default `checkpoints/<project_name>/<experiment_name>`,
  relative to the driver's working directory), with `latest_checkpointed_iteration.txt` naming the last whole one.
- a trainer with a resume flag (`--resume PATH`, `--resume_from_checkpoint PATH`, ...): the value is replaced;
  a flag the job declares (Ray job metadata `argus_resume_flag`, or the JobSpec's `resume_flag`) is added.
- any job: ARGUS_RESUME=1 and ARGUS_RESUME_FROM=<checkpoint> in its environment. For a job submitted through
  Argus that is the documented contract; for a job Argus adopted it is not enough on its own (its trainer never
  heard of it), so such a job counts as not resumable.

Where the checkpoints are (in order, the newest step wins; a tie goes to the first): the directory the job
declares (`argus_checkpoint_dir`), the directories its trainer's arguments name, and `checkpoints/` of every
job folder of its chain of resubmissions (an Argus job writes there through $ARGUS_JOB_DIR, and the chain's
next job has a folder of its own).

One module past 400 lines on purpose: reading the entrypoint, finding the checkpoints and planning the edit
share the trainer's command and the rules above; apart, each would need the others' private parts.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from string import Template

import bashlex

from control.artifacts import step_of
from control.jobspec import RESUME_FLAG_RE
from core.lineage import CHECKPOINT_DIR_KEY, RESUME_FLAG_KEY

VERL_TRACKER = "latest_checkpointed_iteration.txt"
DEEPSPEED_TRACKER = "latest"

# -- rules as data ---------------------------------------------------------------------------------------

# A word that names verl's code: `-m verl.trainer.main_ppo`, `verl/trainer/main_ppo.py`, `recipe/dapo/...` is not.
VERL_WORD = re.compile(r"(?:^|[/.])verl(?:[/.]|$)")
# Hydra overrides only verl's trainers take together (a recipe run as `python -m recipe.x.main` has them too).
VERL_OVERRIDE_GROUPS = ("actor_rollout_ref.", "critic.", "data.train_files", "algorithm.")
HYDRA_KEY = re.compile(r"^[+~]{0,2}(?P<key>[A-Za-z_][\w.]*)=(?P<value>.*)\Z", re.DOTALL)
VERL_RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")
# Flags whose value is the checkpoint to resume from.
RESUME_FLAGS = ("--resume", "--resume_from_checkpoint", "--resume-from-checkpoint", "--resume_from",
                "--resume-from", "--resume_path", "--resume-path", "--load_checkpoint", "--load-checkpoint")
# Flags whose value is where checkpoints are written.
CHECKPOINT_DIR_FLAGS = ("--checkpoint_dir", "--checkpoint-dir", "--ckpt_dir", "--ckpt-dir", "--save_dir",
                        "--save-dir", "--output_dir", "--output-dir", "--out_dir", "--out-dir", "--checkpoints")
# Programs that run a trainer; the first command running one of them is the trainer's, when no rule above says.
SHELLS = re.compile(r"^(?:ba|da|z)?sh\Z")
LAUNCHERS = re.compile(r"^(?:python[0-9.]*|torchrun|accelerate|deepspeed|uv|pixi|conda|srun|mpirun)\Z")


@dataclass(frozen=True)
class Word:
    text: str  # as the shell will see it (quotes removed)
    start: int
    end: int


@dataclass(frozen=True)
class TrainerCommand:
    """The command in an entrypoint that runs the trainer."""

    words: tuple[Word, ...]
    insert_at: int  # after its last word: before its redirections, before a pipe
    cwd: str | None  # the directory a `cd` before it moved to, as written
    piped: bool = False  # its output goes into another command (`| tee log`): the shell's status is that one's

    @property
    def argv(self) -> list[str]:
        return [w.text for w in self.words]


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int


@dataclass(frozen=True)
class ResumePlan:
    """What the resubmitted job runs and what it resumes from; `problem` says why it cannot resume."""

    entrypoint: str
    env: dict[str, str] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    how: str = "none"  # "verl", "flag", "env" or "none"
    arguments: tuple[str, ...] = ()  # what was put on the trainer's command line
    searched: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def resumes(self) -> bool:
        return self.problem is None and self.checkpoint is not None

    def describe(self) -> str:
        if not self.resumes:
            return f"from scratch ({self.problem})"
        assert self.checkpoint is not None
        said = {"verl": f"verl overrides {' '.join(self.arguments)}",
                "flag": f"the trainer's argument {' '.join(self.arguments)}",
                "env": "ARGUS_RESUME_FROM (the trainer reads it)"}[self.how]
        return f"from checkpoint {self.checkpoint.path.name} (step {self.checkpoint.step}), given as {said}"


# -- the entrypoint ------------------------------------------------------------------------------------------


class EntrypointError(ValueError):
    """The entrypoint cannot be read as shell, or runs no trainer Argus can find."""


def _commands(node: object, out: list[tuple[object, bool]], piped: bool = False) -> None:
    """Every command of the tree, with whether its output goes into a later command of its pipeline."""
    kind = getattr(node, "kind", "")
    if kind == "command":
        out.append((node, piped))
        return  # a command's own parts ($(...) inside a word) are not commands of the entrypoint
    parts = getattr(node, "parts", []) or []
    if kind == "pipeline":
        stages = [p for p in parts if getattr(p, "kind", "") != "pipe"]
        for i, part in enumerate(stages):
            _commands(part, out, piped or i < len(stages) - 1)
        return
    for part in parts:
        _commands(part, out, piped)
    for sub in ("list", "command"):  # compound commands ({ ...; }, ( ... ), if/while bodies)
        for part in getattr(node, sub, []) or []:
            _commands(part, out, piped)


def _found_commands(entrypoint: str) -> list[tuple[tuple[Word, ...], int, str | None, bool]]:
    """(words, end of the last word, directory a `cd` before it moved to, piped) of each command that is not a
    `cd`; EntrypointError when the entrypoint cannot be read as shell."""
    try:
        trees = bashlex.parse(entrypoint)
    except Exception as exc:  # noqa: BLE001 - bashlex raises its own errors and, on odd input, plain ones
        raise EntrypointError(f"cannot read the entrypoint as shell: {str(exc)[:160]}") from None
    commands: list[tuple[object, bool]] = []
    for tree in trees:
        _commands(tree, commands)
    found: list[tuple[tuple[Word, ...], int, str | None, bool]] = []
    cwd: str | None = None
    for command, piped in commands:
        parts = getattr(command, "parts", [])
        words = tuple(Word(_unquoted(entrypoint[p.pos[0]:p.pos[1]], p.word), p.pos[0], p.pos[1])
                      for p in parts if getattr(p, "kind", "") == "word")
        if not words:
            continue
        if words[0].text == "cd" and len(words) == 2:
            cwd = words[1].text if cwd is None or words[1].text.startswith("/") else f"{cwd}/{words[1].text}"
            continue
        found.append((words, words[-1].end, cwd, piped))
    if not found:
        raise EntrypointError("the entrypoint runs no command")
    return found


def shell_script(entrypoint: str) -> tuple[Word, str | None] | None:
    """The script of a `bash -c '<script>'` (sh, dash, zsh) command in `entrypoint` and the directory it runs
    in, when there is one: `ray job submit -- bash -c "cd x && python ... | tee log"` keeps its trainer there."""
    try:
        found = _found_commands(entrypoint)
    except EntrypointError:
        return None
    for words, _, cwd, _ in found:
        if len(words) >= 3 and SHELLS.match(PurePosixPath(words[0].text).name) and words[1].text == "-c":
            return words[2], cwd
    return None


def trainer_command(entrypoint: str, resume_flag: str | None = None) -> TrainerCommand:
    """The command of `entrypoint` that runs the trainer; EntrypointError when there is none to find."""
    found = _found_commands(entrypoint)

    def pick(test: object) -> TrainerCommand | None:
        for words, end, where, piped in found:
            if test(words):  # type: ignore[operator]
                return TrainerCommand(words, end, where, piped)
        return None

    flags = (resume_flag,) if resume_flag else ()
    return (pick(lambda ws: _is_verl(ws))
            or pick(lambda ws: any(_flag_value(ws, f) is not None or _has_flag(ws, f) for f in RESUME_FLAGS + flags))
            or pick(lambda ws: bool(LAUNCHERS.match(PurePosixPath(ws[0].text).name)))
            or TrainerCommand(*found[0]))


def exit_status_is_the_trainers(entrypoint: str) -> bool:
    """Whether Ray's status of a job with `entrypoint` is its trainer's. Not when the trainer's output is piped
    into another command (`... | tee train.log`: /bin/sh returns tee's status, it has no pipefail), nor when a
    command runs after it whatever its status (`; echo done`, `|| true`): a trainer that crashed then leaves
    the job SUCCEEDED. `&&` passes a failure on, so `trainer && cp ...` still tells."""
    try:
        command = trainer_command(entrypoint)
        trees = bashlex.parse(entrypoint)
    except Exception:  # noqa: BLE001 - unreadable: Ray's status is all there is
        return True
    wrapped = shell_script(entrypoint)
    if command.piped or (wrapped is not None and not exit_status_is_the_trainers(wrapped[0].text)):
        return False
    for tree in trees:
        if tree.pos[0] >= command.insert_at:
            return False  # a later line of the script
        for part in getattr(tree, "parts", []) or []:
            if getattr(part, "kind", "") == "operator" and part.pos[0] >= command.insert_at and part.op != "&&":
                return False
    return True


def _unquoted(source: str, fallback: str) -> str:
    """The word as the program gets it: shell quoting removed (bashlex keeps some of it, e.g. in '"'"')."""
    try:
        split = shlex.split(source)
    except ValueError:
        return fallback
    return split[0] if len(split) == 1 else fallback


def _is_verl(words: Sequence[Word]) -> bool:
    if any(VERL_WORD.search(w.text) and not any(c.isspace() for c in w.text) for w in words[:4]):
        return True  # a word with spaces is a script given to a shell, not the program
    keys = [m["key"] for w in words if (m := HYDRA_KEY.match(w.text))]
    return any(k.startswith("trainer.") for k in keys) and any(k.startswith(VERL_OVERRIDE_GROUPS) for k in keys)


def _has_flag(words: Sequence[Word], flag: str) -> bool:
    return any(w.text == flag or w.text.startswith(flag + "=") for w in words)


def _flag_value(words: Sequence[Word], flag: str) -> tuple[str, int, int] | None:
    """(value, start, end) of `flag VALUE` or `flag=VALUE` in `words`; None when absent or valueless."""
    for i, w in enumerate(words):
        if w.text.startswith(flag + "="):
            return w.text[len(flag) + 1:], w.start, w.end
        if w.text == flag and i + 1 < len(words) and not words[i + 1].text.startswith("--"):
            nxt = words[i + 1]
            return nxt.text, nxt.start, nxt.end
    return None


def _hydra_value(text: str) -> str:
    """`text` as a Hydra override value: quoted when it holds a character Hydra's grammar reads (`,` makes a
    sweep, `$`, brackets, quotes, spaces)."""
    if re.fullmatch(r"[\w./@:+-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_value(command: TrainerCommand, key: str) -> str | None:
    for w in command.words:
        m = HYDRA_KEY.match(w.text)
        if m and m["key"] == key:
            return m["value"]
    return None


def edit(entrypoint: str, command: TrainerCommand, swaps: Mapping[tuple[int, int], str],
         append: Sequence[str]) -> str:
    """`entrypoint` with the word spans in `swaps` swapped for new (shell-quoted) words, and `append` added
    after the trainer command's last word."""
    edits = sorted([*((span, shlex.quote(text) if text else "") for span, text in swaps.items()),
                    ((command.insert_at, command.insert_at), "".join(" " + shlex.quote(a) for a in append))],
                   reverse=True)
    out = entrypoint
    for (start, end), text in edits:
        out = out[:start] + text + out[end:]
    return out


# -- checkpoints -------------------------------------------------------------------------------------------


def latest_in(folder: Path) -> Checkpoint | None:
    """The newest whole checkpoint in `folder`: the one a tracker file names when it exists (verl and
    DeepSpeed write it after a save completes), else the highest step among the entries."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return None
    for tracker in (VERL_TRACKER, DEEPSPEED_TRACKER):
        try:
            named = (folder / tracker).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        for candidate in (f"global_step_{named}", named):
            path = folder / candidate
            step = step_of(candidate)
            if step is not None and path.exists():
                return Checkpoint(path, step)
    steps = [(step, p) for p in entries if (step := step_of(p.name)) is not None]
    if not steps:
        return None
    step, path = max(steps, key=lambda sp: (sp[0], sp[1].name))
    return Checkpoint(path, step)


def _resolve(path: str, cwd: str | None, env: Mapping[str, str]) -> Path | None:
    """`path` with $VARs from the job's environment, made absolute against the directory the command ran in;
    None when that cannot be known (an unknown variable, a relative path with no known directory)."""
    try:
        expanded = Template(path).substitute(env)
    except (KeyError, ValueError):
        return None
    if expanded.startswith("~"):
        return None
    if not expanded.startswith("/"):
        if cwd is None or not cwd.startswith("/"):
            return None
        expanded = f"{cwd}/{expanded}"
    return Path(expanded)


def checkpoint_dirs(command: TrainerCommand | None, *, verl: bool, declared: str | None,
                    env: Mapping[str, str], cwd: str | None, chain_folders: Sequence[Path]) -> list[Path]:
    """Where the job's checkpoints may be, in the order of the module docstring."""
    where = (command.cwd if command and command.cwd else None) or cwd
    written: list[str] = [declared] if declared else []
    if command is not None:
        if verl:
            local = hydra_value(command, "trainer.default_local_dir")
            project = hydra_value(command, "trainer.project_name")
            experiment = hydra_value(command, "trainer.experiment_name")
            if local:
                written.append(local)
            elif project and experiment:
                written.append(f"checkpoints/{project}/{experiment}")
        for flag in CHECKPOINT_DIR_FLAGS:
            if (found := _flag_value(command.words, flag)) is not None:
                written.append(found[0])
        for flag in RESUME_FLAGS:
            if (found := _flag_value(command.words, flag)) is not None and "/" in found[0]:
                written.append(str(PurePosixPath(found[0]).parent))
    dirs = [p for w in written if (p := _resolve(w, where, env)) is not None]
    dirs += [folder / "checkpoints" for folder in chain_folders]
    seen: set[Path] = set()
    return [d for d in dirs if not (d in seen or seen.add(d))]  # type: ignore[func-returns-value]


def latest_checkpoint(dirs: Sequence[Path], *, verl: bool) -> Checkpoint | None:
    best: Checkpoint | None = None
    for folder in dirs:
        found = latest_in(folder)
        if found is None or (verl and "global_step_" not in found.path.name):
            continue  # verl takes its step from a global_step_N folder's name, nothing else
        if best is None or found.step > best.step:
            best = found
    return best


# -- the plan ----------------------------------------------------------------------------------------------


def plan_resume(entrypoint: str, *, env: Mapping[str, str], metadata: Mapping[str, str],
                chain_folders: Sequence[Path], cwd: str | None, adopted: bool) -> ResumePlan:
    """How the resubmission of a job with `entrypoint` (run with `env`, in `cwd` when known) resumes.

    `chain_folders`: the job folders of its chain, newest first. `adopted`: the job was not submitted through
    Argus, so ARGUS_RESUME_FROM alone does not resume it. The script of a `bash -c '<script>'` is planned as
    an entrypoint of its own and quoted back in."""
    wrapped = shell_script(entrypoint)
    if wrapped is None:
        return _plan(entrypoint, env=env, metadata=metadata, chain_folders=chain_folders, cwd=cwd, adopted=adopted)
    script, where = wrapped
    inner = _plan(script.text, env=env, metadata=metadata, chain_folders=chain_folders, cwd=where or cwd,
                  adopted=adopted)
    outer = entrypoint[:script.start] + shlex.quote(inner.entrypoint) + entrypoint[script.end:]
    return replace(inner, entrypoint=outer if inner.entrypoint != script.text else entrypoint)


def _plan(entrypoint: str, *, env: Mapping[str, str], metadata: Mapping[str, str],
          chain_folders: Sequence[Path], cwd: str | None, adopted: bool) -> ResumePlan:
    declared_flag = metadata.get(RESUME_FLAG_KEY) or None
    if declared_flag is not None and not RESUME_FLAG_RE.match(declared_flag):  # metadata is anyone's to write
        declared_flag = None
    try:
        command: TrainerCommand | None = trainer_command(entrypoint, declared_flag)
        unreadable = None
    except EntrypointError as exc:
        command, unreadable = None, str(exc)
    verl = command is not None and _is_verl(command.words)
    dirs = checkpoint_dirs(command, verl=verl, declared=metadata.get(CHECKPOINT_DIR_KEY) or None, env=env,
                           cwd=cwd, chain_folders=chain_folders)
    searched = tuple(str(d) for d in dirs)
    checkpoint = latest_checkpoint(dirs, verl=verl)
    if checkpoint is None:
        where = ", ".join(searched) or "nowhere Argus can see (no checkpoint directory in its arguments)"
        return ResumePlan(entrypoint, searched=searched, problem=f"no checkpoint found in {where}")
    env_out = {"ARGUS_RESUME": "1", "ARGUS_RESUME_FROM": str(checkpoint.path)}
    if command is None:
        if adopted:
            return ResumePlan(entrypoint, searched=searched, checkpoint=checkpoint,
                              problem=f"{unreadable}: Argus cannot give the checkpoint to its trainer")
        return ResumePlan(entrypoint, env_out, checkpoint, "env", searched=searched)
    if verl:
        args = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={_hydra_value(str(checkpoint.path))}")
        swaps: dict[tuple[int, int], str] = {}
        append: list[str] = []
        for key, arg in zip(VERL_RESUME_KEYS, args, strict=True):
            given = [(w, m) for w in command.words if (m := HYDRA_KEY.match(w.text)) and m["key"] == key]
            if given:  # in place, keeping the user's +/++ prefix; a second mention would make Hydra refuse
                first, match = given[0]
                swaps[(first.start, first.end)] = first.text[:match.start("key")] + arg
                swaps.update({(w.start, w.end): "" for w, _ in given[1:]})
            else:
                append.append(arg)
        return ResumePlan(edit(entrypoint, command, swaps, append), env_out, checkpoint, "verl", args, searched)
    for flag in RESUME_FLAGS + ((declared_flag,) if declared_flag else ()):
        found = _flag_value(command.words, flag)
        if found is not None:
            _, start, end = found
            value_word = entrypoint[start:end]
            new = f"{flag}={checkpoint.path}" if value_word.startswith(flag + "=") else str(checkpoint.path)
            return ResumePlan(edit(entrypoint, command, {(start, end): new}, []), env_out, checkpoint, "flag",
                              (flag, str(checkpoint.path)), searched)
        if flag == declared_flag:
            return ResumePlan(edit(entrypoint, command, {}, [flag, str(checkpoint.path)]), env_out, checkpoint,
                              "flag", (flag, str(checkpoint.path)), searched)
    if adopted:
        return ResumePlan(entrypoint, searched=searched, checkpoint=checkpoint,
                          problem=(f"found {checkpoint.path.name}, but its trainer takes no resume argument Argus "
                                   f"knows (declare one with Ray job metadata {RESUME_FLAG_KEY})"))
    return ResumePlan(entrypoint, env_out, checkpoint, "env", searched=searched)
