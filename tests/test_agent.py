"""Multi-turn agent rollouts: parsing, the batched loop, masks, limits, and the real tiny model.

The loop is driven either by a scripted ``generate`` that replays fixed strings through the real
byte-level tokenizer of ``gear_rl.models`` (so every token boundary, mask and span is exact), or
by the real tiny random model through the trainer's sampler. Python calls run in a real sandbox.
"""

from __future__ import annotations

import pytest

from gear_rl.agent import (
    JSON_FORMAT,
    MARKDOWN_PYTHON_FORMAT,
    PYTHON_FORMAT,
    AgentLoopConfig,
    PythonExecutor,
    ToolCall,
    ToolCallFormat,
    ToolOutput,
    format_sandbox_output,
    parse_json_calls,
    parse_turn,
    run_agent,
    trajectories_to_tensors,
    trajectory_metrics,
)
from gear_rl.agent.tools import PythonSandbox
from gear_rl.models import build_tiny_tokenizer, tiny_random_model

EOS = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def sandbox():
    with PythonSandbox(workers=2, timeout_s=2.0, memory_mb=256) as pool:
        yield pool


class Scripted:
    """A generate function that answers each prompt with its scripted turns, in order.

    Rows are recognised by their original prompt (a prefix of every later input). It ignores
    ``stop_strings`` on purpose, like a sampler that only knows EOS ids: the loop must cut.
    """

    def __init__(self, tokenizer, scripts: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.prompts = {p: tokenizer.encode(p, add_special_tokens=False) for p in scripts}
        self.scripts = {p: list(turns) for p, turns in scripts.items()}
        self.batch_sizes: list[int] = []
        self.requested_budgets: list[list[int]] = []

    def prompt_ids(self) -> list[list[int]]:
        return list(self.prompts.values())

    def __call__(self, prompts, stop_strings, max_new_tokens):
        self.batch_sizes.append(len(prompts))
        self.requested_budgets.append(list(max_new_tokens))
        rows = []
        for ids, cap in zip(prompts, max_new_tokens, strict=True):
            [name] = [p for p, pid in self.prompts.items() if ids[: len(pid)] == pid]
            text = self.scripts[name].pop(0)
            rows.append(self.tokenizer.encode(text, add_special_tokens=False)[:cap])
        return rows


# --- parsing --------------------------------------------------------------------------------
def test_parse_python_calls():
    assert parse_turn("Let me compute. <python>print(1 + 1)</python>", PYTHON_FORMAT).calls == (
        ToolCall(name="python", code="print(1 + 1)"),)
    fenced = parse_turn("<python>\n```python\nx = 2\nprint(x)\n```\n</python>", PYTHON_FORMAT)
    assert fenced.status == "ok" and fenced.calls[0].code == "x = 2\nprint(x)"
    assert parse_turn("The answer is 4.", PYTHON_FORMAT).status == "none"
    assert parse_turn("<python>print(1)", PYTHON_FORMAT).status == "unterminated"
    assert parse_turn("<python>  \n</python>", PYTHON_FORMAT).status == "malformed"
    assert parse_turn("oops </python>", PYTHON_FORMAT).status == "malformed"
    # the last opening tag before the first closing tag is the call
    assert parse_turn("<python>a <python>print(3)</python>", PYTHON_FORMAT).calls[0].code == (
        "print(3)")


def test_parse_markdown_fenced_calls():
    fmt = MARKDOWN_PYTHON_FORMAT
    turn = parse_turn("Let me compute:\n```python\nprint(2 + 2)\n```\nand more", fmt)
    assert turn.status == "ok" and turn.calls[0].code == "print(2 + 2)"
    assert parse_turn("```bash\nls\n```", fmt).status == "none"  # other fences are text
    assert parse_turn("```python\nprint(1)", fmt).status == "unterminated"
    assert parse_turn("```python\n```", fmt).status == "malformed"
    assert fmt.stop == "\n```\n" and fmt.call_span("x```python\na\n```y") == (1, 16)


def test_parse_json_calls_all_layouts():
    one = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_json_calls(one) == (ToolCall("add", {"a": 1, "b": 2}),)
    assert parse_json_calls(f"[{one}, {one}]") == (ToolCall("add", {"a": 1, "b": 2}),) * 2
    toolrl = '{"name": "f", "parameters": {"x": "y"}}\n{"name": "g", "parameters": {}}'
    assert parse_json_calls(toolrl) == (ToolCall("f", {"x": "y"}), ToolCall("g", {}))
    openai = '{"name": "f", "arguments": "{\\"x\\": 1}"}'
    assert parse_json_calls(openai) == (ToolCall("f", {"x": 1}),)
    for bad in ('{"name": "f", "arguments": {"x": 1}', '{"arguments": {}}', "[]", "",
                '{"name": "f", "arguments": [1]}', '"just a string"'):
        turn = parse_turn(f"<tool_call>{bad}</tool_call>", JSON_FORMAT)
        assert turn.status == "malformed" and turn.error, bad


def test_format_validation():
    with pytest.raises(ValueError, match="output"):
        ToolCallFormat(kind="python", open_tag="<a>", close_tag="</a>", observation_template="x")
    with pytest.raises(ValueError, match="kind"):
        ToolCallFormat(kind="sql", open_tag="<a>", close_tag="</a>",  # type: ignore[arg-type]
                       observation_template="{output}")
    with pytest.raises(ValueError, match="format"):
        AgentLoopConfig(tool_format="xml")
    with pytest.raises(ValueError, match="max_turns"):
        AgentLoopConfig(max_turns=0)


# --- the loop, scripted ---------------------------------------------------------------------
def test_python_tool_round_trip_masks_and_spans(tokenizer, sandbox):
    script = Scripted(tokenizer, {
        "Q1: what is 2+2?\n": ["I will compute. <python>print(2 + 2)</python> JUNK AFTER TAG",
                               f"The answer is 4.{EOS}"],
        "Q2: say hi\n": [f"hi{EOS}"],
    })
    trajectories = run_agent(script.prompt_ids(), script, tokenizer, AgentLoopConfig(),
                             PythonExecutor(sandbox))
    first, second = trajectories
    assert first.finish_reason == "answer" and second.finish_reason == "answer"
    assert first.transcript() == ("I will compute. <python>print(2 + 2)</python>"
                                  "\n<result>\n4\n</result>\n"
                                  "The answer is 4.")
    assert tokenizer.decode(first.response_ids) == first.transcript() + EOS
    # the observation is exactly the masked-out span, attributed to turn 0
    [(start, end)] = first.observation_spans
    assert tokenizer.decode(first.response_ids[start:end]) == "\n<result>\n4\n</result>\n"
    assert first.loss_mask == [1] * start + [0] * (end - start) + [1] * (
        len(first.response_ids) - end)
    assert first.turn_ids == [0] * end + [1] * (len(first.response_ids) - end)
    assert first.num_tool_calls == 1 and first.turns[0].outputs == [ToolOutput("4")]
    assert second.observation_spans == [] and second.loss_mask == [1] * len(second.response_ids)
    # finished rows leave the batch: two rows in turn 0, one in turn 1
    assert script.batch_sizes == [2, 1]


def test_markdown_format_round_trip(tokenizer, sandbox):
    script = Scripted(tokenizer, {"q\n": [
        "Compute it:\n```python\nprint(6 * 7)\n```\nSo the answer", f"42.{EOS}"]})
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer,
                             AgentLoopConfig(tool_format="markdown"), PythonExecutor(sandbox))
    assert trajectory.turns[0].text == "Compute it:\n```python\nprint(6 * 7)\n```"
    assert trajectory.turns[0].observation == "\n```output\n42\n```\n"
    assert trajectory.finish_reason == "answer" and trajectory.num_tool_calls == 1


def test_tool_errors_and_limits_become_observations(tokenizer, sandbox):
    script = Scripted(tokenizer, {
        "error\n": ["<python>1/0</python>", f"sorry{EOS}"],
        "slow\n": ["<python>while True: pass</python>", f"gave up{EOS}"],
        "empty\n": ["<python>\n</python>", f"ok{EOS}"],
    })
    config = AgentLoopConfig(max_observation_tokens=200)
    error, slow, empty = run_agent(script.prompt_ids(), script, tokenizer, config,
                                   PythonExecutor(sandbox, timeout_s=0.5))
    assert "ZeroDivisionError: division by zero" in error.turns[0].observation
    assert error.turns[0].outputs[0].error == "tool_error"
    assert "timed out after 0.5 s" in slow.turns[0].observation
    assert slow.turns[0].outputs[0].error == "timeout"
    assert empty.turns[0].observation == "\n<result>\nError: empty code block\n</result>\n"
    assert empty.num_malformed_calls == 1 and empty.num_tool_calls == 0
    assert all(t.finish_reason == "answer" for t in (error, slow, empty))


def test_long_output_is_cut_to_the_observation_cap(tokenizer, sandbox):
    script = Scripted(tokenizer, {"p\n": ["<python>print('x' * 5000)</python>", f"done{EOS}"]})
    config = AgentLoopConfig(max_observation_tokens=50, max_response_tokens=400)
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer, config,
                             PythonExecutor(sandbox))
    observation = trajectory.turns[0].observation
    assert observation == "\n<result>\n" + "x" * 50 + "\n...[truncated]\n</result>\n"
    assert trajectory.finish_reason == "answer"


def test_turn_limit_and_token_budget(tokenizer, sandbox):
    looping = ["<python>print(1)</python>"] * 3
    script = Scripted(tokenizer, {"loop\n": list(looping)})
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer,
                             AgentLoopConfig(max_turns=3), PythonExecutor(sandbox))
    assert trajectory.finish_reason == "max_turns"
    assert trajectory.num_tool_calls == 2  # the call of the last allowed turn is not run
    assert len(trajectory.observation_spans) == 2 and trajectory.turns[-1].observation is None

    # budget: 40 tokens; the first turn (25 tokens) and its observation (21) do not both fit
    script = Scripted(tokenizer, {"budget\n": ["<python>print(12345)</python>", "never"]})
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer,
                             AgentLoopConfig(max_response_tokens=40), PythonExecutor(sandbox))
    assert trajectory.finish_reason == "token_budget"
    assert len(trajectory.response_ids) <= 40 and trajectory.observation_spans == []

    # a turn cut by the remaining budget in the middle of the text
    script = Scripted(tokenizer, {"long\n": ["<python>print(1)</python>", "a" * 500]})
    config = AgentLoopConfig(max_response_tokens=60, max_new_tokens_per_turn=100)
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer, config,
                             PythonExecutor(sandbox))
    assert trajectory.finish_reason == "length" and len(trajectory.response_ids) == 60
    assert script.requested_budgets[-1] == [60 - trajectory.observation_spans[0][1]]


def test_unterminated_call_and_plain_length(tokenizer, sandbox):
    script = Scripted(tokenizer, {"u\n": [f"<python>print(1){EOS}"], "l\n": ["b" * 30]})
    config = AgentLoopConfig(max_new_tokens_per_turn=20)
    unterminated, long = run_agent(script.prompt_ids(), script, tokenizer, config,
                                   PythonExecutor(sandbox))
    assert unterminated.finish_reason == "unterminated_call"
    assert unterminated.num_malformed_calls == 1 and unterminated.num_tool_calls == 0
    assert long.finish_reason == "length" and len(long.response_ids) == 20


def scripted_functions(calls):
    """An executor for JSON calls: ``add`` and ``div`` over the call's arguments."""
    functions = {"add": lambda a, b: a + b, "div": lambda a, b: a / b}
    outputs = []
    for call in calls:
        if call.name not in functions:
            outputs.append(ToolOutput(f"Error: unknown tool {call.name!r}", error="unknown_tool"))
            continue
        try:
            outputs.append(ToolOutput(str(functions[call.name](**call.arguments))))
        except ZeroDivisionError as exc:
            outputs.append(ToolOutput(f"Error: {exc}", error="tool_error"))
    return outputs


def test_json_calls_unknown_tools_and_tool_errors(tokenizer):
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    script = Scripted(tokenizer, {
        "add\n": [call, f"5{EOS}"],
        "unknown\n": ['<tool_call>{"name": "mul", "arguments": {}}</tool_call>', f"hm{EOS}"],
        "broken\n": ['<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>', f"x{EOS}"],
        "raises\n": ['<tool_call>{"name": "div", "arguments": {"a": 1, "b": 0}}</tool_call>',
                     f"y{EOS}"],
        "parallel\n": ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n'
                       '{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>', f"z{EOS}"],
    })
    # the scripted calls are long in a character-level tokenizer
    config = AgentLoopConfig(tool_format="json", max_new_tokens_per_turn=256)
    add, unknown, broken, raises, parallel = run_agent(script.prompt_ids(), script, tokenizer,
                                                       config, scripted_functions)
    assert add.turns[0].observation == "\n<tool_response>\n5\n</tool_response>\n"
    assert unknown.turns[0].outputs[0] == ToolOutput("Error: unknown tool 'mul'",
                                                     error="unknown_tool")
    assert unknown.num_unknown_tool_calls == 1 and unknown.num_malformed_calls == 0
    assert broken.turns[0].observation.startswith("\n<tool_response>\nError: could not parse")
    assert broken.num_malformed_calls == 1 and broken.num_tool_calls == 0
    assert raises.turns[0].outputs[0] == ToolOutput("Error: division by zero", error="tool_error")
    assert parallel.turns[0].observation == "\n<tool_response>\n2\n4\n</tool_response>\n"
    assert parallel.num_tool_calls == 2


def test_function_calling_stops_at_the_call(tokenizer):
    script = Scripted(tokenizer, {"q\n": [
        '<think>easy</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
        " trailing text the model kept writing"]})
    [trajectory] = run_agent(script.prompt_ids(), script, tokenizer,
                             AgentLoopConfig(tool_format="json", stop_after_tool_call=True,
                                         max_new_tokens_per_turn=256))
    assert trajectory.finish_reason == "tool_call"
    assert trajectory.final_text.endswith("</tool_call>")
    assert trajectory.turns[0].parsed.calls == (ToolCall("f", {"x": 1}),)
    assert trajectory.loss_mask == [1] * len(trajectory.response_ids)
    metrics = trajectory_metrics([trajectory])
    # the call counts as made even though it is scored, not run
    assert metrics["agent/tool_call_rate"] == 1.0
    assert metrics["agent/tool_calls_per_trajectory"] == 1.0
    assert metrics["agent/executed_calls_per_trajectory"] == 0.0


def test_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="executor"):
        run_agent([[1, 2]], lambda *a: [[1]], tokenizer, AgentLoopConfig())
    with pytest.raises(ValueError, match="prompts"):
        run_agent([[]], lambda *a: [[1]], tokenizer, AgentLoopConfig(stop_after_tool_call=True))
    with pytest.raises(ValueError, match="generate returned"):
        run_agent([[1], [2]], lambda *a: [[1]], tokenizer,
                  AgentLoopConfig(stop_after_tool_call=True))


def test_tensors_and_metrics(tokenizer, sandbox):
    script = Scripted(tokenizer, {
        "a\n": ["<python>print(7)</python>", f"7{EOS}"],
        "b\n": [f"no tool{EOS}"],
    })
    trajectories = run_agent(script.prompt_ids(), script, tokenizer, AgentLoopConfig(),
                             PythonExecutor(sandbox))
    tensors = trajectories_to_tensors(trajectories, pad_id=tokenizer.pad_token_id)
    lengths = [len(t.response_ids) for t in trajectories]
    assert tensors["response_ids"].shape == (2, max(lengths))
    assert tensors["response_lengths"].tolist() == lengths
    for row, t in enumerate(trajectories):
        n = lengths[row]
        assert tensors["mask"][row, :n].tolist() == [float(m) for m in t.loss_mask]
        assert tensors["mask"][row, n:].sum() == 0 and (tensors["turn_ids"][row, n:] == -1).all()
        assert tensors["observation_mask"][row, :n].tolist() == [1.0 - m for m in t.loss_mask]
    metrics = trajectory_metrics(trajectories)
    assert metrics["agent/tool_call_rate"] == 0.5
    assert metrics["agent/tool_calls_per_trajectory"] == 0.5
    observation = trajectories[0].num_observation_tokens
    assert metrics["agent/observation_token_fraction"] == pytest.approx(observation / sum(lengths))
    assert metrics["agent/finish_answer"] == 1.0


def test_sandbox_output_formatting():
    assert format_sandbox_output("4\n", "", 0, None) == "4"
    assert format_sandbox_output("", "", 0, None) == "(no output)"
    assert format_sandbox_output("", "Traceback\nValueError: x\n", 1, None) == (
        "Traceback\nValueError: x")
    assert format_sandbox_output("partial\n", "", -9, "timeout", timeout_s=2) == (
        "partial\nError: execution timed out after 2 s")
    assert format_sandbox_output("", "", 3, None) == "Error: exit status 3"


# --- the real tiny model --------------------------------------------------------------------
def test_real_tiny_model_multi_turn_invariants(tokenizer, sandbox):
    """A random model writes random bytes; force tool calls by seeding each prompt's response
    with an open call, and check every structural invariant holds whatever it generates."""
    import torch

    from gear_rl.sampling import SamplingParams, sample_responses

    model = tiny_random_model(seed=0, initializer_range=0.2)
    stream = torch.Generator().manual_seed(0)

    def base(prompts, stop_strings, max_new_tokens):
        # the trainer's KV-cache sampler plugs in as it is: it knows EOS ids, not stop strings
        sampling = SamplingParams(max_new_tokens=max(max_new_tokens),
                                  stop_ids=[tokenizer.eos_token_id],
                                  pad_id=tokenizer.pad_token_id)
        return sample_responses(model, prompts, sampling, generator=stream).response_ids

    forced_call = tokenizer.encode("<python>print(6*7)</python>", add_special_tokens=False)
    calls = {"count": 0}

    def generate(prompts, stop_strings, max_new_tokens):
        # turn 0 of the first two rows: the real model after a forced tool call
        rows = base(prompts, stop_strings, max_new_tokens)
        if calls["count"] == 0:
            rows[0] = forced_call
            rows[1] = forced_call
        calls["count"] += 1
        return rows

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"question {i}"}],
                                             add_generation_prompt=True, tokenize=True)
               for i in range(4)]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p)
               for p in prompts]
    config = AgentLoopConfig(max_turns=2, max_new_tokens_per_turn=32, max_response_tokens=128)
    trajectories = run_agent(prompts, generate, tokenizer, config, PythonExecutor(sandbox))
    assert len(trajectories) == 4
    for t in trajectories:
        n = len(t.response_ids)
        assert len(t.loss_mask) == len(t.turn_ids) == n <= config.max_response_tokens
        assert t.finish_reason is not None
        covered = [0] * n
        for start, end in t.observation_spans:
            assert 0 <= start < end <= n
            for k in range(start, end):
                covered[k] = 1
        assert covered == [1 - m for m in t.loss_mask]
        assert t.turn_ids == sorted(t.turn_ids)
    for t in trajectories[:2]:
        assert t.turns[0].observation == "\n<result>\n42\n</result>\n"
        assert t.num_observation_tokens == len(t.turns[0].observation.encode())
    assert trajectory_metrics(trajectories)["agent/tool_call_rate"] >= 0.5


# --- resuming an episode from a prefix (the credit check's continuations) -------------------
class Replay:
    """A generate function that continues every input as one finished episode did: the tokens
    after the input, up to the budget (the loop cuts the turn itself)."""

    def __init__(self, episodes: list[list[int]]) -> None:
        self.episodes = episodes
        self.calls: list[int] = []

    def __call__(self, prompts, stop_strings, max_new_tokens):
        self.calls.append(len(prompts))
        rows = []
        for ids, cap in zip(prompts, max_new_tokens, strict=True):
            [full] = [e for e in self.episodes if e[:len(ids)] == ids]
            rows.append(full[len(ids):len(ids) + cap])
        return rows


def every_cut(originals, seeds=None):
    """Every place an episode can be continued from (before each policy token; never inside an
    observation): per cut, its prompt, its :class:`EpisodePrefix`, the episode it came from and
    that episode's seed (None without ``seeds``)."""
    from gear_rl.agent import EpisodePrefix

    prompts, prefixes, expected, levels = [], [], [], []
    for index, original in enumerate(originals):
        for cut in range(len(original.response_ids)):
            if cut and not original.loss_mask[cut]:
                continue
            prompts.append(original.prompt_ids)
            prefixes.append(EpisodePrefix(original.response_ids[:cut],
                                          original.loss_mask[:cut], original.turn_ids[:cut]))
            expected.append(original)
            levels.append(None if seeds is None else seeds[index])
    return prompts, prefixes, expected, levels


def test_resuming_from_every_prefix_rebuilds_the_episode(tokenizer, sandbox):
    """Continue an episode from each of its token prefixes, all cuts in one batch (rows at
    different turns, some inside a turn): with the episode's own continuation, every resumed row
    is that episode again, tokens, masks, turns, spans, texts and finish reason, and the calls
    after the cut run again in the sandbox."""

    script = Scripted(tokenizer, {
        "Q1\n": ["First <python>print(2 + 3)</python>", "Then <python>print(5 * 4)</python>",
                 f"So 20.{EOS}"],
        "Q2\n": ["Bad <python>print(1 +</python>", f"Fixed: 7.{EOS}"],  # a failing call
        "Q3\n": ["A very long turn that runs past its cap of tokens"],
    })
    config = AgentLoopConfig(max_turns=3, max_new_tokens_per_turn=40, max_response_tokens=200)
    executor = PythonExecutor(sandbox)
    originals = run_agent(script.prompt_ids(), script, tokenizer, config, executor)
    assert [t.finish_reason for t in originals] == ["answer", "answer", "length"]
    assert originals[0].num_tool_calls == 2 and originals[1].num_tool_calls == 1
    assert "SyntaxError" in originals[1].turns[0].observation
    replay = Replay([t.prompt_ids + t.response_ids for t in originals])
    prompts, prefixes, expected, _ = every_cut(originals)
    resumed = run_agent(prompts, replay, tokenizer, config, executor, prefixes=prefixes)
    assert len(resumed) == len(expected) > 100
    for got, want, prefix in zip(resumed, expected, prefixes, strict=True):
        where = f"cut {len(prefix.response_ids)} of {tokenizer.decode(want.prompt_ids)!r}"
        assert got.response_ids == want.response_ids, where
        assert got.loss_mask == want.loss_mask and got.turn_ids == want.turn_ids, where
        assert got.observation_spans == want.observation_spans, where
        assert got.finish_reason == want.finish_reason, where
        assert [t.text for t in got.turns] == [t.text for t in want.turns], where
        assert [t.observation for t in got.turns] == [t.observation for t in want.turns], where
        assert got.policy_text == want.policy_text and got.final_text == want.final_text
    assert max(replay.calls) == len(prompts)  # one batch: rows at different turns together


def test_a_resumed_turn_gets_the_budget_that_was_left(tokenizer, sandbox):
    """A prefix inside a turn: the continuation may only have the turn's remaining tokens, and
    a prefix whose episode already spent its response budget or its turns ends at once."""
    from gear_rl.agent import EpisodePrefix

    script = Scripted(tokenizer, {"Q\n": ["x" * 30]})
    config = AgentLoopConfig(max_turns=2, max_new_tokens_per_turn=12, max_response_tokens=40)
    ids = tokenizer.encode("abcde", add_special_tokens=False)
    [t] = run_agent(script.prompt_ids(), script, tokenizer, config, PythonExecutor(sandbox),
                    prefixes=[EpisodePrefix(ids, [1] * 5, [0] * 5)])
    assert script.requested_budgets == [[12 - 5]]
    assert t.response_ids[:5] == ids and len(t.response_ids) == 12
    assert t.finish_reason == "length"
    full = EpisodePrefix([65] * 40, [1] * 40, [0] * 40)
    never = Scripted(tokenizer, {"Q\n": []})
    [t] = run_agent(never.prompt_ids(), never, tokenizer, config, PythonExecutor(sandbox),
                    prefixes=[full])
    assert t.finish_reason == "token_budget" and never.batch_sizes == []


def test_environment_episodes_resume_from_every_prefix_by_replaying_their_turns(tokenizer):
    """Environment episodes (real Sokoban levels) continued from each of their prefixes, all
    cuts in one batch: replaying the complete turns from the level's seed rebuilds the board,
    so with the episode's own continuation every resumed row is that episode again (tokens,
    masks, spans, state keys, rewards, actions, success, finish reason). A prefix whose
    observation the environment does not give back is refused."""
    from gear_rl.agent import EpisodePrefix
    from gear_rl.agent.env_loop import run_env_episodes
    from gear_rl.envs import SokobanConfig, SokobanEnv

    config = SokobanConfig(num_boxes=1, min_solution_length=2, max_solution_length=3)
    probe = SokobanEnv(config)
    probe.reset(5)
    plan = probe.plan()
    assert plan and len(plan) >= 2
    wrong = {"up": "down", "down": "up", "left": "right", "right": "left"}[plan[0]]
    script = Scripted(tokenizer, {
        "L1\n": [f"I push {plan[0]}.{EOS}", *(f"<action>{m}</action>{EOS}" for m in plan[1:])],
        "L2\n": [f"jump{EOS}", f"{wrong}{EOS}", f"<action>{wrong}</action>{EOS}",
                 f"no idea{EOS}"],
        "L3\n": ["a very long turn that runs past its cap " + plan[0]] * 4,
    })
    limits = {"stop_ids": [tokenizer.eos_token_id], "max_turns": 4,
              "max_new_tokens_per_turn": 24, "max_response_tokens": 900}
    seeds = [5, 5, 5]
    originals = run_env_episodes([SokobanEnv(config) for _ in seeds], seeds,
                                 script.prompt_ids(), script, tokenizer, **limits)
    assert [e.finish_reason for e in originals] == ["solved", "max_turns", "max_turns"]
    assert originals[0].success and len(originals[1].observation_spans) == 3
    # every turn ends as a sampler's does: at its end-of-turn token or at its cap
    assert all(len(range(*span)) == 24 for span in originals[2].step_spans)
    replay = Replay([e.prompt_ids + e.response_ids for e in originals])
    prompts, prefixes, expected, levels = every_cut(originals, seeds)
    resumed = run_env_episodes([SokobanEnv(config) for _ in levels], levels, prompts, replay,
                               tokenizer, prefixes=prefixes, **limits)
    assert len(resumed) == len(expected) > 100
    for got, want, prefix in zip(resumed, expected, prefixes, strict=True):
        where = f"cut {len(prefix.response_ids)} of {tokenizer.decode(want.prompt_ids)!r}"
        for name in ("response_ids", "loss_mask", "turn_ids", "observation_spans", "step_spans",
                     "state_keys", "step_rewards", "shaping_rewards", "actions", "texts",
                     "success", "finish_reason"):
            assert getattr(got, name) == getattr(want, name), (where, name)
    assert max(replay.calls) == len(prompts)  # one batch: rows at different turns together
    # an observation the environment does not give back: another level, or edited tokens
    original = originals[1]
    cut = original.observation_spans[0][1]
    prefix = EpisodePrefix(original.response_ids[:cut], original.loss_mask[:cut],
                           original.turn_ids[:cut])
    with pytest.raises(ValueError, match="observation after turn 0 differs"):
        run_env_episodes([SokobanEnv(config)], [6], [original.prompt_ids], replay, tokenizer,
                         prefixes=[prefix], **limits)
    # the solving turn replayed with more after it: the environment ended the episode there
    solved = originals[0]
    end = solved.step_spans[-1][1]
    tail = tokenizer.encode("\nmore", add_special_tokens=False)
    bad = EpisodePrefix(solved.response_ids[:end] + tail + [65],
                        solved.loss_mask[:end] + [0] * len(tail) + [1],
                        solved.turn_ids[:end] + [len(plan) - 1] * len(tail) + [len(plan)])
    with pytest.raises(ValueError, match=f"ended the episode at turn {len(plan) - 1}"):
        run_env_episodes([SokobanEnv(config)], [5], [solved.prompt_ids], replay, tokenizer,
                         prefixes=[bad], **limits)


@pytest.mark.parametrize(("ids", "mask", "turns", "match"), [
    ([1, 2], [1], [0, 0], "must match"),
    ([1, 2], [1, 2], [0, 0], "only 0 and 1"),
    ([1, 2], [0, 1], [0, 1], "starts with a policy turn"),
    ([1, 2, 3], [1, 0, 1], [0, 0, 0], "expected 1"),
    ([1, 2], [1, 1], [0, 1], "expected 0"),
])
def test_bad_episode_prefixes_are_refused(ids, mask, turns, match):
    from gear_rl.agent import EpisodePrefix

    with pytest.raises(ValueError, match=match):
        EpisodePrefix(ids, mask, turns)


def test_tool_math_turn_rewards_follow_mt_grpo(tokenizer, sandbox):
    """MT-GRPO's verifiable turn rewards on real episodes (the real loop, the real sandbox):
    0.2 x the share of a turn's calls that ran, 0.5 when its output is the answer; one reward
    per step span; a task without turn rewards gives none."""
    from gear_rl.credit.steps import spans_from_step_ids
    from gear_rl.tasks import tool_math_task
    from gear_rl.train.episodes import turn_rewards

    task = tool_math_task(train_size=4, eval_size=2)
    problem = task.train[0]
    answer = problem.answer
    fence = "```python\n{}\n```"
    script = Scripted(tokenizer, {
        "right\n": [fence.format(f"print({answer})"), f"It is {answer}.{EOS}"],
        "wrong\n": [fence.format(f"print({answer} + 1)"), f"It is {answer}.{EOS}"],
        "error\n": [fence.format("1/0"), f"no idea{EOS}"],
        "plain\n": [f"It is {answer}.{EOS}"],
    })
    config = AgentLoopConfig(tool_format="markdown", max_observation_tokens=200)
    episodes = run_agent(script.prompt_ids(), script, tokenizer, config, PythonExecutor(sandbox))
    calls = ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n'
             '{"name": "div", "arguments": {"a": 1, "b": 0}}\n</tool_call>')
    two = Scripted(tokenizer, {"two\n": [calls, f"2{EOS}"]})
    episodes += run_agent(two.prompt_ids(), two, tokenizer,
                          AgentLoopConfig(tool_format="json", max_new_tokens_per_turn=256),
                          scripted_functions)
    rewards = [turn_rewards(task, problem, t) for t in episodes]
    # one of the two parallel calls ran: 0.2 x 1/2
    assert rewards == [pytest.approx([0.7, 0.0]), pytest.approx([0.2, 0.0]), [0.0, 0.0],
                       [0.0], pytest.approx([0.1, 0.0])]
    spans = spans_from_step_ids(trajectories_to_tensors(episodes, pad_id=0)["turn_ids"])
    assert [len(s) for s in spans] == [len(r) for r in rewards]
    assert tool_math_task(train_size=4, eval_size=2, turn_rewards=(0.0, 0.0)).agent is not None
    with pytest.raises(ValueError, match="turn_reward_tool must be a finite number"):
        tool_math_task(train_size=4, eval_size=2, turn_rewards=(float("nan"), 0.5))
