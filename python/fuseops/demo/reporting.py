"""The demo's summary as a text report and its loss curves as a PNG."""

from __future__ import annotations

import os


def report(summary: dict) -> str:
    lines = []
    model = summary["model"]
    lines.append(
        f"model: {model['n_layers']} layers, d_model {model['d_model']}, {model['n_heads']} "
        f"heads, SwiGLU hidden {model['ffn_hidden']}, {model['parameters'] / 1e6:.2f} M "
        f"parameters, {summary['settings']['dtype']}; data: {summary['data']['characters']} "
        f"characters of {summary['data']['source']}"
    )
    lines.append(
        f"{summary['settings']['steps']} steps of batch "
        f"{summary['settings']['batch_size']} x {model['seq_len']}, "
        f"{summary['threads']} threads, fuseops CPU build "
        f"{summary['fuseops_cpu_capability']}; memory: "
        + (
            f"fuseops.cpu.tune_memory(keep_bytes="
            f"{summary['memory_settings']['keep_bytes']}) for every run"
            if summary.get("memory_settings")
            else "process defaults"
        )
    )
    replaced, kept = summary["replaced"], summary["not_replaced"]
    if replaced:
        lines.append(
            f"fuseops replaced {len(replaced)} modules: "
            + ", ".join(f"{r['name']} ({r['old']} -> {r['new']})" for r in replaced)
        )
    else:
        lines.append(
            "fuseops replaced NOTHING: the installed fuseops.nn has no RMSNorm, "
            "SwiGLU or RotaryEmbedding, so the 'fuseops' run executes the same torch "
            "code as the 'torch.nn' run, and its figures show run-to-run noise, "
            "not fuseops"
        )
    if kept:
        lines.append(
            "still plain torch (no fuseops drop-in installed): "
            + ", ".join(f"{k['name']} ({k['type']})" for k in kept)
        )
    lines.append("")
    last_header = f"last {summary['last_steps']} mean"
    width = max(14, *(len(name) for name in summary["runs"]))
    lines.append(
        f"{'run':<{width}}  {'final loss':>10}  {last_header:>12}  {'steps/s':>8}  "
        f"{'vs torch.nn':>11}  {'peak MiB/step':>13}"
    )
    for name, run in summary["runs"].items():
        speed = run["steps_per_second"]
        ratio = run["speedup_vs_torch_nn"]
        peak = run["peak_step_bytes"]
        lines.append(
            f"{name:<{width}}  {run['final_loss']:>10.4f}  {run['mean_loss_last_steps']:>12.4f}  "
            f"{'-' if speed is None else f'{speed:.2f}':>8}  "
            f"{'-' if ratio is None else f'{ratio:.2f}x':>11}  "
            f"{'-' if peak is None else f'{peak / 2**20:.1f}':>13}"
        )
    if any(run.get("other_process") for run in summary["runs"].values()):
        lines.append(
            "+ tune_memory: trained afterwards in a child process under fuseops.cpu."
            f"tune_memory(keep_bytes={summary['memory_settings_tuned']['keep_bytes']}); its "
            "ratio to torch.nn spans two processes, so it carries the machine's drift "
            "between them, while fuseops vs torch.nn within one process does not"
        )
    lines.append("")
    lines.append(
        f"loss curves torch.nn vs fuseops: max |difference| "
        f"{summary['loss_max_abs_diff_first_steps']:.3g} over the first "
        f"{summary['first_steps']} steps, {summary['loss_max_abs_diff']:.3g} over all "
        f"{summary['settings']['steps']}. Kernels that round differently start "
        "the runs apart by an ulp, and training amplifies any such difference, so "
        "later steps agree in trend (the mean of the last steps), not step by step"
    )
    head = summary["lm_head"]
    lines.append(
        f"LM head alone (projection + loss, forward+backward on {head['tokens']} tokens "
        f"x {head['vocab_size']} classes; logits {head['logits_bytes'] / 2**20:.2f} MiB): "
        f"peak {head['peak_bytes']['torch.nn'] / 2**20:.2f} MiB torch.nn, "
        f"{head['peak_bytes']['fuseops'] / 2**20:.2f} MiB fuseops"
    )
    quantized = summary.get("quantized_inference")
    if quantized:
        trained = quantized[0]
        lines.append("")
        lines.append(
            f"the trained fuseops model on {summary['settings']['quantized_eval_batches']} "
            "held-out batches, as trained and after fuseops.quantize_(model, mode) "
            "(linear layers only; the tied embedding stays as trained):"
        )
        lines.append(
            f"{'mode':<12}  {'layers':>6}  {'loss':>7}  {'perplexity':>10}  "
            f"{'linear weights MiB':>18}  {'forward ms':>10}  {'vs trained':>10}"
        )
        for row in quantized:
            lines.append(
                f"{row['mode']:<12}  {row['layers_quantized']:>6}  {row['loss']:>7.4f}  "
                f"{row['perplexity']:>10.3f}  {row['linear_weight_bytes'] / 2**20:>18.3f}  "
                f"{row['forward_seconds'] * 1e3:>10.2f}  "
                f"{trained['forward_seconds'] / row['forward_seconds']:>9.2f}x"
            )
        lines.append(
            "forward ms: median of the batches' inference forward (loss included); "
            "2:4 prunes the trained weights without fine-tuning, so its loss shows "
            "what pruning alone costs"
        )
    lines.append(
        f"steps/s excludes the first {summary['warmup_steps']} steps (warm-up, "
        "compilation); peak MiB/step: most memory allocated during one training "
        "step above what was allocated before it (torch.profiler memory events)"
    )
    return "\n".join(lines)


def write_plot(path: str, summary: dict) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_diff) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    styles = {"torch.nn": ("-", 2.5), "fuseops": ("--", 1.2), "torch.compile": (":", 1.2)}
    for name, run in summary["runs"].items():
        style, width = styles.get(name, ("-", 1))
        ax.plot(run["losses"], style, linewidth=width, label=name)
    ax.set_ylabel("training loss (cross entropy)")
    ax.legend()
    ax.set_title(
        f"TinyLlama on {os.path.basename(summary['data']['source'].split()[0])}, "
        f"{summary['settings']['dtype']}, {summary['threads']} threads",
        fontsize=10,
    )
    base = summary["runs"]["torch.nn"]["losses"]
    for name, run in summary["runs"].items():
        if name != "torch.nn":
            # Equal losses (difference 0) sit at the floor of the log scale.
            ax_diff.plot(
                [max(abs(a - b), 1e-9) for a, b in zip(run["losses"], base)],
                label=name,
                linewidth=1,
            )
    ax_diff.set_yscale("log")
    ax_diff.set_ylabel("|loss - torch.nn|")
    ax_diff.legend(fontsize=8)
    ax_diff.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
