"""Teacher prompts: placement of the reference block, chat-template rendering, and the
prompt/response boundary checked against one naive forward over the whole rendered conversation."""

from __future__ import annotations

import pytest
import torch

from gear_rl.models import build_tiny_tokenizer, load_policy, tiny_random_model
from gear_rl.signals import (
    TeacherPromptConfig,
    build_prompt_pairs,
    prompt_ids,
    teacher_messages,
    teacher_prompt_ids,
    token_signals,
)

pytestmark = pytest.mark.usefixtures("one_thread")


QUESTION = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 7 * 8?"}]


def test_reference_block_goes_at_the_end_of_the_last_user_message():
    messages = [*QUESTION, {"role": "assistant", "content": "Hmm."},
                {"role": "user", "content": "Try again."}]
    original = [dict(m) for m in messages]
    out = teacher_messages(messages, "56")
    assert messages == original  # not modified in place
    assert out[:3] == original[:3]
    assert out[3]["content"].startswith("Try again.\n\n=== Reference")
    assert "The correct final answer is: 56\n" in out[3]["content"]
    assert "Solve the problem yourself" in out[3]["content"]


def test_placements_kinds_and_braces():
    config = TeacherPromptConfig(placement="system")
    out = teacher_messages(QUESTION, "x = {1, 2}", kind="solution", config=config)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("You are terse.\n\n===")
    assert "x = {1, 2}" in out[0]["content"] and "Reference solution" in out[0]["content"]
    out = teacher_messages(QUESTION[1:], "56", config=config)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("=== Reference")
    out = teacher_messages(QUESTION, '{"name": "mul", "arguments": {"a": 7, "b": 8}}',
                           kind="tool_call",
                           config=TeacherPromptConfig(placement="new_user_turn"))
    assert len(out) == 3 and out[2]["role"] == "user"
    assert out[2]["content"].startswith("=== Reference tool call")
    custom = TeacherPromptConfig(answer_template=" [hint: {reference}]")
    assert teacher_messages(QUESTION, " 56 ", config=custom)[1]["content"] == (
        "What is 7 * 8? [hint: 56]"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: TeacherPromptConfig(placement="end"), "placement must be one of"),
        (lambda: TeacherPromptConfig(answer_template="no slot"), "answer_template must be"),
        (lambda: teacher_messages(QUESTION, "56", kind="proof"), "kind must be one of"),
        (lambda: teacher_messages(QUESTION, "  "), "reference must be a non-empty str"),
        (lambda: teacher_messages([], "56"), "messages must be a non-empty list"),
        (lambda: teacher_messages([{"role": "user", "content": 5}], "56"),
         r"messages\[0\]\['content'\] must be a str"),
        (lambda: teacher_messages(QUESTION[:1], "56"), "no 'user' message"),
        (lambda: build_prompt_pairs(build_tiny_tokenizer(), [QUESTION], ["1", "2"]),
         "references has 2 entries but prompts has 1"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_prompt_ids_render_through_the_chat_template():
    tokenizer = build_tiny_tokenizer()
    ids = prompt_ids(tokenizer, QUESTION)
    text = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 7 * 8?" \
           "<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(ids) == text
    teacher = teacher_prompt_ids(tokenizer, QUESTION, "56")
    # Same conversation up to the hint, same generation prompt at the end.
    head = tokenizer(text[: text.index("8?") + 2], add_special_tokens=False)["input_ids"]
    assert teacher[: len(head)] == ids[: len(head)] == head
    suffix = tokenizer("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert teacher[-len(suffix["input_ids"]):] == suffix["input_ids"]
    assert "56" in tokenizer.decode(teacher)
    # Plain-text prompts: the block is appended to the text.
    plain = teacher_prompt_ids(tokenizer, "Q: 7 * 8 =", "56")
    assert tokenizer.decode(plain).startswith("Q: 7 * 8 =\n\n=== Reference")
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        prompt_ids(tokenizer, QUESTION)


def _naive_teacher_logprobs(model, tokenizer, messages, reference, response_text):
    """Render the whole teacher conversation, assistant turn included, run one forward and read
    the log-probs of the assistant's tokens."""
    conversation = [*teacher_messages(messages, reference),
                    {"role": "assistant", "content": response_text}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    response = tokenizer(response_text + "<|im_end|>", add_special_tokens=False)["input_ids"]
    starts = [i for i in range(len(full)) if full[i: i + len(response)] == response]
    assert len(starts) == 1
    start = starts[0]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
    return [logprobs[start + t - 1, token].item() for t, token in enumerate(response)], response


def test_teacher_boundary_against_one_full_forward():
    model = tiny_random_model("llama", initializer_range=0.3, seed=2)
    tokenizer = build_tiny_tokenizer()
    prompts = [QUESTION, [{"role": "user", "content": "2 + 2?"}]]
    references = ["56", "4"]
    responses_text = ["7 * 8 = 56", "It is 4."]
    student, teacher = build_prompt_pairs(tokenizer, prompts, references)
    responses = [tokenizer(r + "<|im_end|>", add_special_tokens=False)["input_ids"]
                 for r in responses_text]
    sig = token_signals(model, student, teacher, responses, estimator="k1")
    for b in range(2):
        expected, ids = _naive_teacher_logprobs(model, tokenizer, prompts[b], references[b],
                                                responses_text[b])
        assert ids == responses[b]
        got = sig.teacher_logprobs[b, : len(ids)].tolist()
        assert got == pytest.approx(expected, abs=1e-5)
    assert sig.divergence.abs().max() > 1e-3  # the hint changes the distribution


@pytest.mark.slow
def test_smollm2_teacher_knows_the_answer():
    """On the real model the reference makes the correct answer's tokens more likely."""
    model, tokenizer = load_policy("smollm2-135m")
    prompts = [[{"role": "user", "content": "What is 7 * 8? Reply with the number only."}],
               [{"role": "user", "content": "What is 13 + 29? Reply with the number only."}]]
    references = ["56", "42"]
    student, teacher = build_prompt_pairs(tokenizer, prompts, references)
    responses = [tokenizer(r + "<|im_end|>", add_special_tokens=False)["input_ids"]
                 for r in references]
    sig = token_signals(model, student, teacher, responses)
    assert torch.isfinite(sig.divergence).all() and (sig.divergence >= -1e-6).all()
    for b in range(2):
        answer = slice(0, len(responses[b]) - 1)  # the answer's tokens, not the end of turn
        assert sig.teacher_logprobs[b, answer].sum() > sig.student_logprobs[b, answer].sum()
