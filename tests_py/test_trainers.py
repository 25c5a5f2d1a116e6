"""Where Hugging Face users train: ``transformers.Trainer``, TRL's
``SFTTrainer``, ``DPOTrainer`` and ``GRPOTrainer`` and PEFT's LoRA adapters
on a model patched by ``fuseops.transformers.apply`` (TRL's trainers with
their LM head on fuseops too: ``fuseops.trl.apply``), against the same run
of the unpatched model.

A tiny Llama (2 layers, hidden 64, a 64-token vocabulary) trains a few
steps on a fixed token sequence, from the same seed, with the same data
order. The patched model's losses and final weights must follow the
unpatched model's: float32 runs differ only in the order of float32 sums
inside the fused ops (about 1e-6 relative per step, test_transformers.py),
which a few optimizer steps of learning rate 1e-3 carry to under 1e-4; the
bound 1e-3 leaves margin, and a patch that dropped the loss's
normalisation, the gradient-accumulation count or a gradient would move the
losses by far more. bfloat16 mixed precision (``bf16=True``, CPU autocast)
rounds each GEMM's output to 2^-9: the bound there is 2e-2 relative.
GRPO's completions, sampled from the seeded generator, must be the same
tokens in both runs, and so its rewards equal.

Skipped with a message where the packages are missing; ``tools/setup.sh``
installs them (the ``trainers`` extra).
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
)

import fuseops.transformers as fot  # noqa: E402
from support import tiny_llama  # noqa: E402

VOCAB = 64
SEQ = 16
CONFIG = dict(tiny_llama.CONFIG, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FLOAT32_BOUND = 1e-3
BFLOAT16_BOUND = 2e-2


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))


class TokenDataset(torch.utils.data.Dataset):
    """Fixed random token rows, each its own labels (some positions ignored)."""

    def __init__(self, rows: int = 16):
        gen = torch.Generator().manual_seed(3)
        self.ids = torch.randint(3, VOCAB, (rows, SEQ), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        labels = self.ids[index].clone()
        labels[:2] = -100
        return {"input_ids": self.ids[index], "labels": labels}


# Four logged steps, seeded data order, on the CPU, nothing saved or reported.
TRAINING = dict(
    per_device_train_batch_size=4,
    max_steps=4,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    seed=0,
    data_seed=0,
    use_cpu=True,
    dataloader_num_workers=0,
    disable_tqdm=True,
)


def training_args(tmp_path, **overrides):
    return transformers.TrainingArguments(output_dir=str(tmp_path), **{**TRAINING, **overrides})


def train(model, tmp_path, **overrides):
    trainer = transformers.Trainer(
        model=model, args=training_args(tmp_path, **overrides), train_dataset=TokenDataset()
    )
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def assert_trained(initial, trained):
    # Four Adam steps of 1e-3 move every trained weight by about 1e-3 each.
    moved = max(
        (a.detach() - b.detach()).abs().max().item()
        for a, b in zip(initial.parameters(), trained.parameters())
    )
    assert moved > 1e-3, moved


def assert_weights_follow(ref, patched, bound):
    for (name, a), (_, b) in zip(ref.named_parameters(), patched.named_parameters()):
        scale = a.detach().abs().max().item()
        assert (a.detach() - b.detach()).abs().max().item() <= bound * scale, name


@pytest.mark.parametrize(
    "options,bound",
    [
        ({}, FLOAT32_BOUND),
        # num_items_in_batch: the sum over both micro-batches divided by their count.
        ({"gradient_accumulation_steps": 2, "per_device_train_batch_size": 2}, FLOAT32_BOUND),
        ({"activation_checkpointing": True}, FLOAT32_BOUND),
        ({"bf16": True}, BFLOAT16_BOUND),
    ],
    ids=["float32", "grad-accumulation", "grad-checkpointing", "bf16"],
)
def test_trainer_patched_follows_unpatched(tmp_path, options, bound):
    ref = tiny_llama()
    initial = copy.deepcopy(ref)
    patched = copy.deepcopy(ref)
    assert fot.apply(patched)
    want = train(ref, tmp_path / "ref", **options)
    got = train(patched, tmp_path / "patched", **options)
    assert len(want) == len(got) == 4
    assert all(math.isfinite(loss) for loss in got)
    for a, b in zip(got, want):
        assert relative(a, b) <= bound, (got, want)
    assert_trained(initial, ref)
    assert_weights_follow(ref, patched, 10 * bound)


# PEFT and TRL still call transformers' names for activation checkpointing
# that transformers 5 deprecates (TRL's DPO and GRPO also turn it off and on
# around their no-grad passes).
DEPRECATED_CHECKPOINTING = pytest.mark.filterwarnings(
    "ignore:`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated:FutureWarning"
)


@DEPRECATED_CHECKPOINTING
def test_peft_lora_on_a_patched_model(tmp_path):
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install peft)")
    lora = dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], lora_dropout=0.0
    )
    ref = tiny_llama()
    patched = copy.deepcopy(ref)
    fot.apply(patched)
    ref = peft.get_peft_model(ref, peft.LoraConfig(**lora))
    torch.manual_seed(0)
    patched = peft.get_peft_model(patched, peft.LoraConfig(**lora))
    # The same adapter weights in both (their initialisation draws random numbers).
    patched.load_state_dict(ref.state_dict())
    want = train(ref, tmp_path / "ref")
    got = train(patched, tmp_path / "patched")
    for a, b in zip(got, want):
        assert relative(a, b) <= FLOAT32_BOUND, (got, want)
    trained = [n for n, p in patched.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert_weights_follow(ref, patched, 10 * FLOAT32_BOUND)


@contextlib.contextmanager
def trl_head(patched: bool):
    """TRL's fused LM head (add_fused_lm_head) on fuseops' ops
    (fuseops.trl.apply) in the patched run, TRL's own in the other."""
    import fuseops.trl

    if patched:
        fuseops.trl.apply()
    try:
        yield
    finally:
        fuseops.trl.revert()


# The ops of a run patched by fuseops.transformers.apply and fuseops.trl.apply.
PATCHED_OPS = {
    "fuseops::rms_norm",
    "fuseops::rope",
    "fuseops::swiglu",
    "fuseops::linear_cross_entropy_stats",
}


def word_level_tokenizer():
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


@DEPRECATED_CHECKPOINTING
def test_trl_sft_trainer_on_a_patched_model(tmp_path):
    # TRL's SFTTrainer puts its chunked LM head on the model (trl's
    # add_fused_lm_head: called with fused_lm_head=True, the forward runs the
    # base model, then the head's log-probabilities), which fuseops.trl runs
    # on fuseops.linear_cross_entropy_stats: the loss, the token accuracy and
    # the entropy it logs are fuseops', over fuseops' norms, rotary and MLPs.
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    gen = torch.Generator().manual_seed(5)
    texts = [
        " ".join(f"w{int(i)}" for i in torch.randint(4, VOCAB, (SEQ,), generator=gen))
        for _ in range(16)
    ]
    data = datasets.Dataset.from_dict({"text": texts})
    logged, ran = {}, set()
    for name in ("ref", "patched"):
        model = tiny_llama()
        if name == "patched":
            fot.apply(model)
        # TRL's configs default to bf16=True; the bound below is float32's.
        config = trl.SFTConfig(
            output_dir=str(tmp_path / name), max_length=SEQ + 2, bf16=False, **TRAINING
        )
        trainer = trl.SFTTrainer(
            model=model, args=config, train_dataset=data, processing_class=word_level_tokenizer()
        )
        with (
            trl_head(name == "patched"),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        ):
            trainer.train()
        if name == "patched":
            ran = {e.name for e in prof.events() if e.name.startswith("fuseops::")}
        logged[name] = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert PATCHED_OPS <= ran, sorted(ran)
    assert len(logged["patched"]) == len(logged["ref"]) == 4
    for got, want in zip(logged["patched"], logged["ref"]):
        assert relative(got["loss"], want["loss"]) <= FLOAT32_BOUND, logged
        assert relative(got["entropy"], want["entropy"]) <= FLOAT32_BOUND, logged
        # The share of argmax hits among the batch's 60-odd tokens: equal
        # unless a near tie flips one token (1/60).
        assert abs(got["mean_token_accuracy"] - want["mean_token_accuracy"]) <= 0.02, logged


def words(gen, count, low=4, high=VOCAB) -> str:
    """`count` words of the tokenizer drawn from token ids [low, high)."""
    return " ".join(f"w{int(i)}" for i in torch.randint(low, high, (count,), generator=gen))


# The first half of the words: DPO's chosen completions and GRPO's reward.
HALF = (4 + VOCAB) // 2


def fuseops_ops(profile) -> set:
    return {e.name for e in profile.events() if e.name.startswith("fuseops::")}


@DEPRECATED_CHECKPOINTING
def test_trl_dpo_trainer_on_a_patched_model(tmp_path):
    # DPOTrainer, like SFTTrainer, puts TRL's chunked LM head on the policy and
    # on the reference model (add_fused_lm_head), on fuseops' ops in the
    # patched run (fuseops.trl): the sequence log-probabilities behind the
    # loss, the rewards and the entropy are fuseops', over fuseops' norms,
    # rotary and MLPs, in the policy's forward and backward and in the
    # reference model's forward. Both models are patched in the patched run, as
    # a user applying fuseops to both would have them; TRL's defaults otherwise
    # (activation checkpointing, beta 0.1, the sigmoid loss), in float32.
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    gen = torch.Generator().manual_seed(7)
    # A preference the policy can learn in four steps: chosen completions from
    # the first half of the words, rejected ones from the second.
    data = datasets.Dataset.from_dict(
        {
            "prompt": [words(gen, 6) for _ in range(16)],
            "chosen": [" " + words(gen, 5, high=HALF) for _ in range(16)],
            "rejected": [" " + words(gen, 5, low=HALF) for _ in range(16)],
        }
    )
    logged, models, ran = {}, {}, set()
    for name in ("unpatched", "patched"):
        model, reference = tiny_llama(), tiny_llama()
        if name == "patched":
            assert fot.apply(model) and fot.apply(reference)
        config = trl.DPOConfig(output_dir=str(tmp_path / name), bf16=False, **TRAINING)
        trainer = trl.DPOTrainer(
            model=model,
            ref_model=reference,
            args=config,
            train_dataset=data,
            processing_class=word_level_tokenizer(),
        )
        with (
            trl_head(name == "patched"),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        ):
            trainer.train()
        if name == "patched":
            ran = fuseops_ops(prof)
        logged[name] = [entry for entry in trainer.state.log_history if "loss" in entry]
        models[name] = model
    assert PATCHED_OPS <= ran, sorted(ran)
    assert len(logged["patched"]) == len(logged["unpatched"]) == 4
    for got, want in zip(logged["patched"], logged["unpatched"]):
        for key in ("loss", "entropy", "logps/chosen", "logps/rejected"):
            assert relative(got[key], want[key]) <= FLOAT32_BOUND, (key, logged)
        # rewards = beta * (policy's - reference's log-probability of a
        # completion): two sums of 6 token log-probabilities (about -25), each
        # within the under-1e-4 relative drift of a few float32 steps (module
        # docstring), so the rewards within 2 * beta * 1e-4 * 25 = 5e-4, a
        # twentieth of the margin learned in four steps.
        bound = 2 * config.beta * (FLOAT32_BOUND / 10) * abs(want["logps/chosen"])
        for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
            assert abs(got[key] - want[key]) <= bound, (key, logged)
    # The preference was learned (the margin grows from 0), so the comparisons
    # above are of a trained policy, not of the initial one.
    assert logged["unpatched"][-1]["rewards/margins"] > 0.01, logged
    assert_trained(tiny_llama(), models["unpatched"])
    assert_weights_follow(models["unpatched"], models["patched"], 10 * FLOAT32_BOUND)


@DEPRECATED_CHECKPOINTING
def test_trl_grpo_trainer_on_a_patched_model(tmp_path):
    # GRPOTrainer samples completions with generate (KV cache, through the
    # patched causal LM's forward: fuseops' norms, rotary and MLPs; without
    # labels its logits are the head's product, as in HF), then scores them
    # with TRL's chunked LM head over the backbone, as DPO does (fuseops'
    # in the patched run: fuseops.trl). Each of two generations samples 4 completions of up
    # to 8 tokens for one prompt, at temperature 1 from the seeded generator;
    # the reward counts the completion's tokens among the first half of the
    # words. Each generation serves two optimizer steps (num_iterations=2),
    # so the second step's loss holds the importance ratio, clipped or not,
    # between the updated policy and the one that sampled. No reference model
    # (TRL's default beta=0); an entropy bonus (entropy_coef), whose gradient
    # flows through the head's entropy.
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    gen = torch.Generator().manual_seed(11)
    data = datasets.Dataset.from_dict({"prompt": [words(gen, 6) for _ in range(2)]})
    logged, models, sampled, ran = {}, {}, {}, set()
    for name in ("unpatched", "patched"):
        completions = sampled[name] = []

        def first_half(completion_ids, **kwargs):
            completions.append([list(ids) for ids in completion_ids])
            return [float(sum(4 <= t < HALF for t in ids)) for ids in completion_ids]

        model = tiny_llama()
        if name == "patched":
            assert fot.apply(model)
        config = trl.GRPOConfig(
            output_dir=str(tmp_path / name),
            bf16=False,
            num_generations=4,
            max_completion_length=8,
            num_iterations=2,
            entropy_coef=0.05,
            **TRAINING,
        )
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=first_half,
            args=config,
            train_dataset=data,
            processing_class=word_level_tokenizer(),
        )
        with (
            trl_head(name == "patched"),
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        ):
            trainer.train()
        if name == "patched":
            ran = fuseops_ops(prof)
        logged[name] = [entry for entry in trainer.state.log_history if "loss" in entry]
        models[name] = model
    assert PATCHED_OPS <= ran, sorted(ran)
    # The same tokens sampled: the seeded draws pick another token only where
    # one falls within the runs' ~1e-6 logit difference of a boundary between
    # two tokens' cumulative probabilities.
    assert len(sampled["unpatched"]) == 2
    assert sampled["patched"] == sampled["unpatched"]
    assert len(logged["patched"]) == len(logged["unpatched"]) == 4
    for got, want in zip(logged["patched"], logged["unpatched"]):
        assert relative(got["entropy"], want["entropy"]) <= FLOAT32_BOUND, logged
        # Advantages are normalised to unit deviation within each group, and
        # the loss is their mean weighted by importance ratios near 1: an
        # absolute bound at the scale of 1.
        assert abs(got["loss"] - want["loss"]) <= FLOAT32_BOUND, logged
        if "reward" in want:  # logged on the steps that sampled
            assert got["reward"] == want["reward"], logged
            assert got["reward_std"] == want["reward_std"], logged
    assert_trained(tiny_llama(), models["unpatched"])
    assert_weights_follow(models["unpatched"], models["patched"], 10 * FLOAT32_BOUND)


def head_inputs(model, input_ids, attention_mask):
    """The final hidden states [B, L, H] (after the last norm) and the LM
    head's weight: what fuseops' fused losses take instead of logits."""
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return hidden.last_hidden_state, model.lm_head.weight


def assert_grads_match(model, got_loss, want_loss):
    # The gradient of every parameter, fuseops' loss against TRL's on the
    # same model and batch: float32 sums in another order (module docstring).
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(got_loss, params)
    want = torch.autograd.grad(want_loss, params)
    for g, w in zip(got, want):
        scale = max(w.abs().max().item(), 1e-6)
        assert (g - w).abs().max().item() <= 1e-4 * scale


def trainer_loss_and_heads(trainer_class, config, model, reference, data):
    """A TRL preference trainer's own loss on its first collated batch, and
    what fuseops' fused loss takes for the same batch: the policy's and the
    reference's hidden states before each next token and their heads, the
    completion tokens as shifted labels (-100 elsewhere)."""
    trainer = trainer_class(
        model=model,
        ref_model=reference,
        args=config,
        train_dataset=data,
        processing_class=word_level_tokenizer(),
    )
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    model.train()
    want = trainer._compute_loss(model, batch, return_outputs=False)
    ids, attention = batch["input_ids"], batch["attention_mask"]
    labels = ids.masked_fill(batch["completion_mask"] == 0, -100)[:, 1:]
    hidden, weight = head_inputs(model, ids, attention)
    with torch.no_grad():
        ref_hidden, ref_weight = head_inputs(reference, ids, attention)
    heads = dict(input=hidden[:, :-1], linear_weight=weight, target=labels)
    heads.update(ref_input=ref_hidden[:, :-1], ref_weight=ref_weight)
    return trainer, batch, want, heads


@DEPRECATED_CHECKPOINTING
@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_fused_linear_dpo_is_trls_dpo_loss(tmp_path, loss_type):
    # fuseops.preference.fused_linear_dpo on the policy's and the reference's
    # hidden states and heads, against DPOTrainer's own loss on one collated
    # batch ([chosen, rejected], the completion mask as its labels).
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    from fuseops import preference

    gen = torch.Generator().manual_seed(7)
    data = datasets.Dataset.from_dict(
        {
            "prompt": [words(gen, int(n)) for n in torch.randint(3, 7, (4,), generator=gen)],
            "chosen": [" " + words(gen, int(n)) for n in torch.randint(2, 6, (4,), generator=gen)],
            "rejected": [
                " " + words(gen, int(n)) for n in torch.randint(2, 6, (4,), generator=gen)
            ],
        }
    )
    model, reference = tiny_llama(), tiny_llama(seed=1)
    config = trl.DPOConfig(output_dir=str(tmp_path), bf16=False, loss_type=loss_type, **TRAINING)
    _, _, want, heads = trainer_loss_and_heads(trl.DPOTrainer, config, model, reference, data)
    got = preference.fused_linear_dpo(**heads, beta=config.beta, loss_type=loss_type)
    assert abs(got.loss.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    assert_grads_match(model, got.loss, want)


@DEPRECATED_CHECKPOINTING
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_fused_linear_grpo_is_trls_grpo_loss(tmp_path, loss_type):
    # fuseops.preference.fused_linear_grpo against GRPOTrainer's own loss on
    # one batch of completions, with old log-probabilities of another policy
    # (ratios clipped on both sides) and a reference model's (beta > 0).
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    from fuseops import preference

    gen = torch.Generator().manual_seed(13)
    model = tiny_llama()
    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        bf16=False,
        num_generations=4,
        max_completion_length=6,
        loss_type=loss_type,
        **TRAINING,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=lambda completion_ids, **kwargs: [0.0] * len(completion_ids),
        args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": [words(gen, 4)]}),
        processing_class=word_level_tokenizer(),
    )
    b, prompt, completion = 4, 5, config.max_completion_length
    prompt_ids = torch.randint(4, VOCAB, (b, prompt), generator=gen)
    completion_ids = torch.randint(4, VOCAB, (b, completion), generator=gen)
    completion_mask = torch.ones(b, completion, dtype=torch.long)
    completion_mask[1, 4:] = 0
    completion_mask[3, 2:] = 0
    old = -4.2 + 0.3 * torch.randn(b, completion, generator=gen)
    ref = -4.2 + 0.3 * torch.randn(b, completion, generator=gen)
    advantages = torch.randn(b, generator=gen)
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones(b, prompt, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": completion_mask.sum().float(),
    }
    # One micro-batch, the whole accumulation window (the training loop sets
    # this per window; the loss divides by it). The KL term's weight is set on
    # the trainer: a config with beta > 0 would load a reference model from
    # the hub, and the batch gives the reference's log-probabilities anyway.
    trainer.current_gradient_accumulation_steps = 1
    trainer.beta = 0.05
    model.train()
    want = trainer._compute_loss(model, inputs)

    ids = torch.cat([prompt_ids, completion_ids], 1)
    hidden, weight = head_inputs(model, ids, torch.ones_like(ids))
    target = completion_ids.masked_fill(completion_mask == 0, -100)
    # dapo's normaliser: the batch's completion tokens, rescaled by TRL to
    # one accumulation window of the generation batch.
    window = trainer.current_gradient_accumulation_steps / config.steps_per_generation
    got = preference.fused_linear_grpo(
        hidden[:, prompt - 1 : -1],
        weight,
        target,
        advantages,
        old,
        ref,
        beta=trainer.beta,
        epsilon_low=trainer.epsilon_low,
        epsilon_high=trainer.epsilon_high,
        loss_type=loss_type,
        num_items_in_batch=float(completion_mask.sum()) * window,
        max_completion_length=completion,
    )
    # Both sides of the clip are reached, so the comparison covers it.
    assert 0 < got.clip_fraction < 1
    assert abs(got.loss.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    assert_grads_match(model, got.loss, want)


@DEPRECATED_CHECKPOINTING
@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_fused_linear_kto_is_trls_kto_loss(tmp_path, loss_type):
    # fuseops.preference.fused_linear_kto against KTOTrainer's own loss on one
    # collated batch of unpaired examples, with TRL's KL reference point (the
    # policy's and the reference's log-probabilities of mismatched
    # prompt/completion pairs, TRL's computation, passed as kl=).
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    from fuseops import preference

    gen = torch.Generator().manual_seed(5)
    data = datasets.Dataset.from_dict(
        {
            "prompt": [words(gen, int(n)) for n in torch.randint(3, 7, (4,), generator=gen)],
            "completion": [
                " " + words(gen, int(n)) for n in torch.randint(2, 6, (4,), generator=gen)
            ],
            "label": [True, False, True, False],
        }
    )
    model, reference = tiny_llama(), tiny_llama(seed=1)
    with torch.no_grad():
        # A sharper reference: random tokens less likely under it, so that the
        # KL reference point is above its clamp at 0.
        reference.lm_head.weight.mul_(4)
    config = trl.KTOConfig(
        output_dir=str(tmp_path),
        bf16=False,
        loss_type=loss_type,
        desirable_weight=1.3,
        undesirable_weight=0.7,
        **TRAINING,
    )
    trainer, batch, want, heads = trainer_loss_and_heads(
        trl.KTOTrainer, config, model, reference, data
    )
    kl = None  # apo_zero_unpaired has no reference point (TRL: 0)
    if trainer.calculate_KL:
        with torch.no_grad():
            mismatched = trainer._compute_kl_logps(model, batch)
            kl = (mismatched - trainer._compute_kl_logps(reference, batch)).mean().clamp(min=0)
        assert kl > 0
    got = preference.fused_linear_kto(
        desirable=torch.as_tensor(batch["label"], dtype=torch.bool),
        kl=kl,
        beta=config.beta,
        desirable_weight=config.desirable_weight,
        undesirable_weight=config.undesirable_weight,
        loss_type=loss_type,
        **heads,
    )
    assert abs(got.loss.item() - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    assert_grads_match(model, got.loss, want)
