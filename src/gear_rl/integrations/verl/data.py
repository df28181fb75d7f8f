"""verl parquet for the recipe's three settings, from the files their sources publish.

::

    python -m gear_rl.integrations.verl.data SETTING SRC OUT_DIR [--test-fraction 0.1]
        [--seed 0] [--test-src PATH] [--skip-invalid]

writes ``OUT_DIR/train.parquet`` and ``OUT_DIR/test.parquet`` (``recipes/verl/run_gear_qwen3_4b.sh``
reads ``$GEAR_DATA/<setting>/{train,test}.parquet``), one row per problem in the columns verl
0.9.1's ``RLHFDataset`` reads (``verl/utils/dataset/rl_dataset.py``: ``data.prompt_key`` default
``prompt``, chat messages; ``extra_info.index``, optional ``extra_info.tools_kwargs``) and its
reward managers pass to the reward function (``data_source``, ``reward_model.ground_truth``,
``extra_info``; ``verl/experimental/reward_loop/reward_manager/naive.py``):

- ``data_source``: ``gear_rl/gsm8k``, ``gear_rl/math`` or ``gear_rl/toolrl``. None is a name
  verl's built-in scorers know (``verl/utils/reward_score/__init__.py``), so a run that forgets
  ``reward.custom_reward_function`` (``gear_rl/integrations/verl/rewards.py``, which scores as
  ``gear-rl train`` does) fails at once instead of training on another scorer's rewards.
- ``prompt``: ``[{"role", "content"}, ...]``; ``ability``: ``math`` or ``tool_use``.
- ``reward_model``: ``{"style": "rule", "ground_truth": <str>}``.
- ``extra_info``: ``split``, ``index`` (position in its split), ``source`` (file and row it came
  from), and per setting: math/tir ``layout`` (``gsm8k`` or ``math``), ``question``,
  ``reference_solution`` (the source's worked solution: ``algorithm.gear.reference_kind=solution
  algorithm.gear.reference_key=extra_info.reference_solution`` shows it to the teacher;
  ``gear-rl train`` on these files shows the answer, as the recipe does); toolrl ``reference``
  (the gold ``<tool_call>`` block, or the ``<response>``: what ``gear-rl train``'s ToolRL task
  shows its teacher; ``REFERENCE_KEY=extra_info.reference`` makes the recipe show the same
  instead of the whole gold output) and ``reference_kind``.

Settings and the layouts read (a ``.jsonl`` file, a ``.json`` list or single object, a
``.parquet`` file, or a directory of them, read recursively in sorted order):

- ``math``: GSM8K rows (``question``, ``answer`` ending in ``#### <number>``; the ground truth is
  that number, normalised by ``gear_rl.tasks.answers.normalize_number``) and MATH rows
  (``problem``, ``solution`` with ``\\boxed{...}``; the ground truth is the last boxed content,
  ``gear_rl.tasks.answers.last_boxed``), told apart row by row. The prompt is the question and
  :data:`MATH_INSTRUCTION`.
- ``tir``: the same sources, with :data:`TIR_SYSTEM_PROMPT` offering the Python tool
  (:data:`TOOL_NAME`, ``recipes/verl/python_tool.yaml``; the recipe runs verl's ``tool_agent``
  loop, which gives the model the tool's schema through the chat template). No
  ``tools_kwargs`` are written: the tool takes no per-trajectory state.
- ``toolrl``: ToolRL's raw rows (``instruction``, ``input``, ``output``; Qian et al., arXiv
  2504.13958), read with ``gear_rl.tasks.toolrl.toolrl_problem``: system prompt
  ``instruction``, user ``input``; the ground truth is the gold ``output``.

Problems are deduplicated by prompt (the first row kept), then split deterministically: a seeded
shuffle holds out ``test_fraction`` of them (at least one, never all), or ``--test-src`` gives the
test problems and training rows with the same prompt are dropped. A row that fits no layout is
refused with a ``ValueError`` naming its file and row (``--skip-invalid``: dropped and counted).

:func:`write_example_data` writes small generated data in the same layout for smoke runs
(``gear_rl.integrations.verl.cpu_job``): one-digit products, and generated ToolRL-layout rows.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gear_rl.safe_json import loads_bounded
from gear_rl.tasks.answers import last_boxed, normalize_number
from gear_rl.tasks.math_check import is_blank_answer
from gear_rl.tasks.toolrl import toolrl_problem
from gear_rl.tasks.verl_data import located_rows

__all__ = [
    "AGENT_LOOP_NAME",
    "DATA_SOURCES",
    "ENV_DATA_SOURCE",
    "ENV_SETTINGS",
    "MATH_INSTRUCTION",
    "SETTINGS",
    "TIR_SYSTEM_PROMPT",
    "TOOL_NAME",
    "Written",
    "env_data_rows",
    "gsm8k_answer",
    "is_env_setting",
    "main",
    "math_fields",
    "source_rows",
    "verl_rows",
    "write_example_data",
    "write_verl_data",
]

SETTINGS = ("math", "tir", "toolrl")
PRODUCTS = "products"
"""The example-data setting that is ``gear-rl train``'s default task as it is: reasoning-gym
one-digit ``products``, prompts exactly as the trainer shows them (its instruction, not the
recipe's ``\\boxed{}`` one), the trainer's training problems and its first held-out ones;
single-turn, scored like ``math``. For comparisons of the two engines (a verl study of the
default task, ``scripts/verl_smollm2.py``)."""
ENV_SETTINGS = ("sokoban", "keydoor", "textarena:GAME")
"""The environment settings: gear-rl's text games, played by the ``gear_env`` agent loop
(``textarena`` takes its game after a colon, e.g. ``textarena:FrozenLake-v0``)."""
AGENT_LOOP_NAME = "gear_env"
"""verl's name of gear-rl's environment agent loop (``gear_rl.integrations.verl.agent_loop``),
written in each environment row's ``agent_name``."""
ENV_DATA_SOURCE = "gear_rl/env/"
"""The prefix of an environment row's ``data_source`` (then the environment's name)."""
TOOL_NAME = "python"
"""The tool's function name in ``recipes/verl/python_tool.yaml`` and the tir prompt."""
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TIR_SYSTEM_PROMPT = (
    f"You are a helpful assistant that solves math problems. You can call the `{TOOL_NAME}` tool "
    "to run Python code (numpy and sympy are available); it returns what the code prints. Use "
    "it for calculations and checks, then give your final answer within \\boxed{}."
)
DATA_SOURCES = {"gsm8k": "gear_rl/gsm8k", "math": "gear_rl/math", "toolrl": "gear_rl/toolrl"}
ABILITIES = {"math": "math", "tir": "math", "toolrl": "tool_use"}
_SUFFIXES = (".json", ".jsonl", ".parquet")
_GSM8K_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


# --- reading --------------------------------------------------------------------------------
def source_rows(src: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Every row of ``src`` with its place (``"FILE line N"`` / ``"FILE row N"`` / ``"FILE"``).

    ``src``: a ``.jsonl`` file, a ``.json`` file holding a list of rows or one row (MATH's
    original one-problem files), a ``.parquet`` file, or a directory: every such file under it,
    in sorted path order. Unreadable text, non-object rows and unknown suffixes raise
    ``ValueError`` naming the file (``gear_rl.tasks.verl_data.located_rows``).
    """
    path = Path(src)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
        if not files:
            raise ValueError(f"{path}: a directory with no {'/'.join(_SUFFIXES)} files")
        return [row for file in files for row in _file_rows(file)]
    if not path.is_file():
        raise ValueError(f"{path}: no such file or directory")
    return _file_rows(path)


def _file_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    if path.suffix == ".json":
        try:
            data = loads_bounded(path.read_bytes().decode("utf-8-sig"))
        except ValueError:  # not UTF-8, not JSON, nested too deeply
            data = None  # located_rows names the place of the fault
        if isinstance(data, dict):
            return [(str(path), data)]
    return located_rows(path)


def gsm8k_answer(answer: str) -> str | None:
    """The number after GSM8K's final ``####`` (thousands commas removed), or None when the
    answer has no ``####`` or no plain number follows it."""
    if "####" not in answer:
        return None
    number = normalize_number(answer.rsplit("####", 1)[1].strip())
    return number if _GSM8K_NUMBER.fullmatch(number) else None


def math_fields(row: dict[str, Any], where: str) -> tuple[str, str, str, str]:
    """``(layout, question, ground_truth, worked_solution)`` of a GSM8K or MATH row.

    Raises:
        ValueError: naming ``where`` and the row's keys when it fits neither layout.
    """
    question, answer = row.get("question"), row.get("answer")
    if isinstance(question, str) and isinstance(answer, str) and question.strip():
        number = gsm8k_answer(answer)
        if number is not None:
            return "gsm8k", question.strip(), number, answer.rsplit("####", 1)[0].strip()
    problem, solution = row.get("problem"), row.get("solution")
    if isinstance(problem, str) and isinstance(solution, str) and problem.strip():
        boxed = last_boxed(solution)
        if boxed is not None and not is_blank_answer(boxed):
            return "math", problem.strip(), boxed, solution.strip()
    raise ValueError(
        f"{where}: fits neither GSM8K's layout ('question' and an 'answer' ending in "
        "'#### <number>') nor MATH's ('problem' and a 'solution' with a non-empty "
        f"\\boxed{{...}}); its keys: {sorted(row)}")


def _math_row(setting: str, row: dict[str, Any], where: str) -> dict[str, Any]:
    layout, question, gold, solution = math_fields(row, where)
    user = {"role": "user", "content": f"{question}\n\n{MATH_INSTRUCTION}"}
    prompt = [{"role": "system", "content": TIR_SYSTEM_PROMPT}, user] if setting == "tir" else [
        user]
    return {
        "data_source": DATA_SOURCES[layout],
        "prompt": prompt,
        "ability": ABILITIES[setting],
        "reward_model": {"style": "rule", "ground_truth": gold},
        "extra_info": {"split": "", "index": 0, "source": where, "layout": layout,
                       "question": question, "reference_solution": solution},
    }


def _toolrl_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        problem = toolrl_problem(row, 0)
    except ValueError as exc:  # its message names "train row 0"; name the file's row instead
        reason = str(exc).split(": ", 1)[-1]
        raise ValueError(f"{where}: {reason}; its keys: {sorted(row)}") from exc
    if not problem.answer.strip():
        raise ValueError(f"{where}: 'output' (the gold answer) is empty")
    return {
        "data_source": DATA_SOURCES["toolrl"],
        "prompt": problem.prompt,
        "ability": ABILITIES["toolrl"],
        "reward_model": {"style": "rule", "ground_truth": problem.answer},
        "extra_info": {"split": "", "index": 0, "source": where, "reference": problem.reference,
                       "reference_kind": problem.reference_kind},
    }


def verl_rows(setting: str, located: Sequence[tuple[str, dict[str, Any]]], *,
              skip_invalid: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The verl rows of ``located`` (rows with their places) for ``setting``, in order, and how
    many rows were skipped (``skip_invalid``; otherwise a row that fits no layout raises a
    ``ValueError`` naming its place)."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    rows, skipped = [], 0
    for where, row in located:
        try:
            rows.append(_toolrl_row(row, where) if setting == "toolrl"
                        else _math_row(setting, row, where))
        except ValueError:
            if not skip_invalid:
                raise
            skipped += 1
    return rows, skipped


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row["prompt"], ensure_ascii=False, sort_keys=True)


def _dedupe(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int]:
    """Rows with the first of each prompt kept; how many dropped, how many of those had another
    ground truth than the kept row."""
    kept: dict[str, dict[str, Any]] = {}
    dropped = conflicting = 0
    for row in rows:
        first = kept.setdefault(_key(row), row)
        if first is not row:
            dropped += 1
            conflicting += first["reward_model"]["ground_truth"] != row["reward_model"][
                "ground_truth"]
    return list(kept.values()), dropped, conflicting


# --- writing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Written:
    """What :func:`write_verl_data` wrote.

    Attributes:
        setting: ``math``, ``tir`` or ``toolrl``.
        train_path, test_path: the two parquet files.
        train, test: rows in each.
        read: rows read from the sources (train and test sources together).
        duplicates: rows dropped because an earlier row had the same prompt (within a source,
            and training rows that repeat a test prompt); ``conflicting``: how many of them had
            another ground truth than the row kept.
        skipped: rows that fit no layout, dropped by ``skip_invalid``.
        layouts: rows written per source layout (``gsm8k``, ``math``, ``toolrl``).
    """

    setting: str
    train_path: Path
    test_path: Path
    train: int
    test: int
    read: int
    duplicates: int
    conflicting: int
    skipped: int
    layouts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One paragraph saying what was written."""
        layouts = ", ".join(f"{n} {name}" for name, n in sorted(self.layouts.items()))
        dropped = f"{self.duplicates} duplicate prompt(s) dropped"
        if self.conflicting:
            dropped += f" ({self.conflicting} with another ground truth than the row kept)"
        skipped = f", {self.skipped} row(s) fitting no layout skipped" if self.skipped else ""
        return (f"{self.setting}: wrote {self.train} train rows to {self.train_path} and "
                f"{self.test} test rows to {self.test_path} ({layouts}); read {self.read} "
                f"row(s), {dropped}{skipped}")


def _split(rows: list[dict[str, Any]], test_fraction: float, seed: int
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if len(rows) < 2:
        raise ValueError(f"need at least 2 distinct problems to hold some out, got {len(rows)}")
    n_test = min(len(rows) - 1, max(1, round(len(rows) * test_fraction)))
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_test])
    return ([row for i, row in enumerate(rows) if i not in held],
            [row for i, row in enumerate(rows) if i in held])


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gear_rl.rundir import atomic_write_bytes

    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    atomic_write_bytes(path, buffer.getvalue().to_pybytes())


def write_verl_data(
    setting: str,
    src: str | Path,
    out_dir: str | Path,
    *,
    test_fraction: float = 0.1,
    seed: int = 0,
    test_src: str | Path | None = None,
    skip_invalid: bool = False,
) -> Written:
    """Write ``out_dir/train.parquet`` and ``out_dir/test.parquet`` for ``setting`` from ``src``
    (see the module docstring for layouts, columns, deduplication and the split).

    Args:
        setting: ``math``, ``tir`` or ``toolrl``.
        src: the source file or directory.
        out_dir: created if missing; the two files are replaced atomically.
        test_fraction: share of the problems held out for ``test.parquet``, in (0, 1); not used
            with ``test_src``.
        seed: the hold-out shuffle's seed.
        test_src: a separate source of test problems (GSM8K's ``test.jsonl``, MATH's ``test/``).
        skip_invalid: drop rows that fit no layout (counted in :attr:`Written.skipped`) instead
            of refusing the input.

    Raises:
        ValueError: for an unknown setting, a bad ``test_fraction``, a missing or empty source,
            a row that fits no layout (naming file and row), fewer than two distinct problems,
            or an empty split.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float))
            or not math.isfinite(test_fraction) or not 0 < test_fraction < 1):
        raise ValueError(f"test_fraction must be a number in (0, 1), got {test_fraction!r}")
    located = source_rows(src)
    if not located:
        raise ValueError(f"{src}: no rows")
    rows, skipped = verl_rows(setting, located, skip_invalid=skip_invalid)
    read = len(located)
    if not rows:
        raise ValueError(f"{src}: none of its {len(located)} rows fits a {setting} layout")
    rows, duplicates, conflicting = _dedupe(rows)
    if test_src is None:
        train, test = _split(rows, test_fraction, seed)
    else:
        located_test = source_rows(test_src)
        if not located_test:
            raise ValueError(f"{test_src}: no rows")
        read += len(located_test)
        test, skipped_test = verl_rows(setting, located_test, skip_invalid=skip_invalid)
        skipped += skipped_test
        test, test_duplicates, test_conflicting = _dedupe(test)
        held = {_key(row) for row in test}
        train = [row for row in rows if _key(row) not in held]
        overlap = len(rows) - len(train)
        duplicates += test_duplicates + overlap
        conflicting += test_conflicting
        if not train or not test:
            raise ValueError(f"empty split: {len(train)} train and {len(test)} test problems "
                             f"after dropping {overlap} training rows that repeat a test prompt")
    return _write_splits(setting, train, test, out_dir, read=read, duplicates=duplicates,
                         conflicting=conflicting, skipped=skipped)


def _write_splits(setting: str, train: list[dict[str, Any]], test: list[dict[str, Any]],
                  out_dir: str | Path, *, read: int, duplicates: int, conflicting: int,
                  skipped: int) -> Written:
    """Number the rows of each split, write both files, say what was written."""
    for split, part in (("train", train), ("test", test)):
        for index, row in enumerate(part):
            row["extra_info"] = {**row["extra_info"], "split": split, "index": index}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_path, test_path = out / "train.parquet", out / "test.parquet"
    _write_parquet(train, train_path)
    _write_parquet(test, test_path)
    layouts = Counter(str(row["extra_info"].get("layout", "toolrl")) for row in train + test)
    return Written(setting=setting, train_path=train_path, test_path=test_path,
                   train=len(train), test=len(test), read=read, duplicates=duplicates,
                   conflicting=conflicting, skipped=skipped, layouts=dict(layouts))


# --- small generated data (smoke runs) ------------------------------------------------------
_EXAMPLE_TOOLS = (
    {"name": "get_weather", "description": "Current weather in a city.",
     "parameters": {"city": {"type": "string"}, "unit": {"type": "string",
                                                         "enum": ["celsius", "fahrenheit"]}}},
    {"name": "convert_currency", "description": "Convert an amount between currencies.",
     "parameters": {"amount": {"type": "number"}, "from_currency": {"type": "string"},
                    "to_currency": {"type": "string"}}},
)
_EXAMPLE_INSTRUCTION = (
    "You are a helpful assistant that can call tools. Available tools:\n"
    + "\n".join(json.dumps(tool) for tool in _EXAMPLE_TOOLS)
    + "\n\nFirst think inside <think> </think>, then answer with a <tool_call> block holding one "
    'JSON object per line, {"name": ..., "parameters": {...}}:\n'
    "<think> your reasoning </think>\n<tool_call>\n"
    '{"name": "tool_name", "parameters": {"parameter": "value"}}\n</tool_call>'
)
_CITIES = ("Paris", "Rome", "Tokyo", "Lima", "Oslo", "Cairo", "Delhi", "Quito")
_CURRENCIES = ("USD", "EUR", "JPY", "GBP", "INR", "BRL")


def _example_toolrl_row(rng: random.Random) -> dict[str, Any]:
    """One generated function-calling row in ToolRL's raw layout (one call per row)."""
    if rng.random() < 0.5:
        city, unit = rng.choice(_CITIES), rng.choice(("celsius", "fahrenheit"))
        query = f"What is the weather in {city} right now, in {unit}?"
        call = {"name": "get_weather", "parameters": {"city": city, "unit": unit}}
    else:
        amount = rng.randint(1, 500)
        source, target = rng.sample(_CURRENCIES, 2)
        query = f"How much is {amount} {source} in {target}?"
        call = {"name": "convert_currency", "parameters": {
            "amount": amount, "from_currency": source, "to_currency": target}}
    output = (f"<think>The user asks: {query} I call {call['name']}.</think>\n<tool_call>\n"
              f"{json.dumps(call)}\n</tool_call>")
    return {"instruction": _EXAMPLE_INSTRUCTION, "input": query, "output": output}


def is_env_setting(setting: str) -> bool:
    """Whether ``setting`` names one of gear-rl's environments (:data:`ENV_SETTINGS`)."""
    from gear_rl.tasks.agentic import ENV_NAMES

    return isinstance(setting, str) and setting.partition(":")[0] in ENV_NAMES


def env_data_rows(setting: str, *, options: dict[str, Any] | None = None, train_size: int = 64,
                  eval_size: int = 16, seed: int = 0, max_turns: int | None = None,
                  max_new_tokens_per_turn: int | None = None
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out rows of environment ``setting`` (``sokoban``, ``keydoor``,
    ``textarena:GAME``): one level per row, the levels ``gear-rl train task=<setting>`` draws
    with the same ``seed``, ``train_size`` and ``eval_size`` (``gear_rl.tasks.agentic.
    env_task``). Each row's prompt is the level's first board; ``agent_name`` is
    :data:`AGENT_LOOP_NAME`; ``reward_model.ground_truth`` the BFS planner's shortest moves;
    ``extra_info`` the level (``env``, ``env_options`` as a JSON string, ``env_seed``,
    ``max_turns``, ``max_new_tokens_per_turn``) and the teacher's hint (``reference``, as
    ``gear-rl train`` shows it, ``reference_kind`` ``solution``)."""
    from gear_rl.agent.loop import AgentLimits
    from gear_rl.tasks.agentic import env_task

    if not is_env_setting(setting):
        raise ValueError(f"not an environment setting: {setting!r}; one of {ENV_SETTINGS}")
    options = dict(options or {})
    task = env_task(setting, options=options, max_turns=max_turns, train_size=train_size,
                    eval_size=eval_size, seed=seed)
    per_turn = (AgentLimits.max_new_tokens_per_turn if max_new_tokens_per_turn is None
                else max_new_tokens_per_turn)

    def row(problem: Any) -> dict[str, Any]:
        return {
            "data_source": ENV_DATA_SOURCE + setting, "prompt": problem.prompt,
            "ability": "agent", "agent_name": AGENT_LOOP_NAME,
            "reward_model": {"style": "rule", "ground_truth": problem.answer},
            "extra_info": {"layout": f"env/{setting}", "env": setting,
                           "env_options": json.dumps(options, sort_keys=True),
                           "env_seed": int(problem.metadata["env_seed"]),
                           "max_turns": task.env.max_turns if task.env is not None else None,
                           "max_new_tokens_per_turn": per_turn,
                           "plan_length": int(problem.metadata["plan_length"]),
                           "reference": problem.reference, "reference_kind": "solution",
                           "source": problem.id}}

    return [row(p) for p in task.train], [row(p) for p in task.eval]


def products_rows(*, train_size: int, eval_size: int
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:data:`PRODUCTS`' rows: ``gear-rl train``'s default task (``load_task("products")``,
    seed 0, as every run builds it) with its prompts as chat messages, the answer as
    ``reward_model.ground_truth`` and the problem id as ``extra_info.id``; ``train_size``
    training problems and the first ``eval_size`` held-out ones."""
    from gear_rl.tasks import load_task

    task = load_task(PRODUCTS, train_size=train_size, eval_size=eval_size, seed=0)
    return tuple([{"data_source": f"gear_rl/{PRODUCTS}", "prompt": p.prompt, "ability": "math",
                   "reward_model": {"style": "rule", "ground_truth": p.answer},
                   "extra_info": {"id": p.id, "layout": f"gear_rl/{PRODUCTS}"}}
                  for p in problems]
                 for problems in (task.train, task.eval[:eval_size]))  # type: ignore[return-value]


def write_example_data(setting: str, out_dir: str | Path, *, train_size: int = 64,
                       eval_size: int = 16, seed: int = 0) -> Written:
    """Small generated data for ``setting`` in the same layout, for smoke runs: one-digit
    products from gear-rl's default task (reasoning-gym ``products``, preset ``products`` of
    ``gear_rl.tasks.reasoning_gym_task``; held-out problems from its own seed, none also in
    training) for ``math`` and, with the tool prompt, ``tir``; generated single-call rows in
    ToolRL's raw layout (two tools, weather and currency) for ``toolrl``. Each goes through the
    same conversion as :func:`write_verl_data`; deduplication can leave fewer than
    ``train_size`` / ``eval_size`` rows (one-digit products repeat)."""
    if setting not in (*SETTINGS, PRODUCTS) and not is_env_setting(setting):
        raise ValueError(f"setting must be one of {(*SETTINGS, PRODUCTS)} or an environment "
                         f"{ENV_SETTINGS}, got {setting!r}")
    for name, value in (("train_size", train_size), ("eval_size", eval_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if is_env_setting(setting):
        train, test = env_data_rows(setting, train_size=train_size, eval_size=eval_size,
                                    seed=seed)
        read, duplicates, conflicting = len(train) + len(test), 0, 0
    elif setting == PRODUCTS:
        train, test = products_rows(train_size=train_size, eval_size=eval_size)
        read, duplicates, conflicting = len(train) + len(test), 0, 0
    elif setting == "toolrl":
        rng = random.Random(seed)
        rows, _ = verl_rows(setting, [(f"generated row {i + 1}", _example_toolrl_row(rng))
                                      for i in range(train_size + eval_size)])
        read = len(rows)
        rows, duplicates, conflicting = _dedupe(rows)
        train, test = _split(rows, eval_size / (train_size + eval_size), seed)
    else:
        from gear_rl.tasks.reasoning_gym_task import reasoning_gym_task

        task = reasoning_gym_task("products", train_size=train_size, eval_size=eval_size,
                                  seed=seed)
        train, test = (verl_rows(setting, [
            (f"reasoning_gym products {problem.id}",
             {"question": problem.prompt[-1]["content"], "answer": f"#### {problem.answer}"})
            for problem in problems])[0] for problems in (task.train, task.eval))
        for row in train + test:  # read through GSM8K's layout; say where they came from
            row["data_source"] = "gear_rl/products"
            row["extra_info"]["layout"] = "reasoning_gym/products"
        read = len(train) + len(test)
        train, duplicates, conflicting = _dedupe(train)
        test, test_duplicates, test_conflicting = _dedupe(test)
        duplicates, conflicting = duplicates + test_duplicates, conflicting + test_conflicting
    return _write_splits(setting, train, test, out_dir, read=read, duplicates=duplicates,
                         conflicting=conflicting, skipped=0)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); prints what was written. Exit status 0, or
    2 with the reason on stderr."""
    parser = argparse.ArgumentParser(
        prog="python -m gear_rl.integrations.verl.data",
        description="Write verl parquet (OUT_DIR/train.parquet, OUT_DIR/test.parquet) for the "
                    "GEAR verl recipe's settings from the sources' published files.")
    parser.add_argument("setting", choices=SETTINGS, help="math, tir or toolrl")
    parser.add_argument("src", help="source file (.jsonl, .json, .parquet) or directory")
    parser.add_argument("out_dir", help="output directory")
    parser.add_argument("--test-fraction", type=float, default=0.1,
                        help="share of problems held out (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="hold-out shuffle seed (default 0)")
    parser.add_argument("--test-src", default=None,
                        help="separate test source instead of a held-out share")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="drop rows that fit no layout instead of refusing the input")
    args = parser.parse_args(argv)
    try:
        written = write_verl_data(args.setting, args.src, args.out_dir,
                                  test_fraction=args.test_fraction, seed=args.seed,
                                  test_src=args.test_src, skip_invalid=args.skip_invalid)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(written.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
