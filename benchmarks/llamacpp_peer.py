"""llama.cpp as the CPU peer of quantized decode (issue 37): the same random weights at F16, Q8_0 and Q4_0.

    .venv/bin/pip install -e '.[tools,peers]'      # llama-cpp-python is compiled from PyPI's source package
    .venv/bin/python benchmarks/llamacpp_peer.py [--layers 24 | --tiny] [--quants f16,q8_0,q4_0]
                                                 [--threads 1,all] [--prompt 32] [--steps 64] [--warmup 4]
                                                 [--rounds 3] [--check-steps 16] [--seed 0] [--pure]
                                                 [--keep DIR [--rebuild]] [--no-perturb] [--flash-attn]

What it does, in order:

1. Builds ``Qwen2ForCausalLM`` with Qwen2-0.5B's shape (hidden 896, intermediate 4864, 24 layers, 14 heads /
   2 KV heads, vocabulary 151936, tied embeddings) in float32 with seeded random weights, built as
   ``real_width.py`` builds it (same seed, same weights), then, unless ``--no-perturb``, the RMSNorm weights
   (1 + N(0, 0.1)) and the q/k/v biases (N(0, 0.1)) are drawn from a second seeded generator: Hugging Face
   initialises them to ones and zeros, and a check on ones and zeros would not notice a misnamed norm or bias.
   ``--tiny`` is a 2-layer, 128-wide model with a 1024-token vocabulary (a quick check); ``--layers N`` keeps
   the width and changes the depth.
2. Saves it as a Hugging Face checkpoint (safetensors) in a temporary directory; everything after reads
   that checkpoint: the float32 reference is ``from_pretrained`` of it (eager attention), and the GGUF F16
   file is written from its safetensors with the ``gguf`` package (llama.cpp's ``qwen2`` architecture,
   tensor names from gguf's own ``TensorNameMap``, 2-D weights F16, norms and biases F32 as
   ``convert_hf_to_gguf.py`` writes them; a synthetic SentencePiece-type vocabulary of the model's size, since
   llama.cpp needs one to load: ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens, then placeholders; token ids are fed
   directly, so the vocabulary is never used to tokenize).
3. Quantizes the F16 file to Q8_0 and Q4_0 with llama.cpp's own ``llama_model_quantize`` (what
   ``llama-quantize model-f16.gguf Q4_0`` does, llama.cpp's default type choice per tensor: the tied
   embedding / output matrix gets a wider type; ``--pure`` makes every matrix the named type). The tensor
   types actually written are read back and reported.
4. Correctness first: the prompt (``--prompt`` seeded random ids) and the float32 model's greedy
   continuation (``--check-steps`` tokens) are fed to llama.cpp: the prompt as one batch, then one token per
   ``llama_decode`` (``Llama(logits_all=True)``, ``Llama.eval``, logits from ``Llama.scores``), and every
   position's next-token logits are compared with the float32 model's teacher-forced logits: max and mean abs
   difference, top-1 agreement, KL(f32 || llama.cpp). The F16 tolerance is measured, not assumed: the same
   float32 model with its weights rounded to float16 and every Linear's input rounded to float16 and the K/V
   projections' outputs rounded to float16 (what llama.cpp's F16 path rounds: F16 weights, F16 matmul inputs, F16
   KV cache) is run beside it; llama.cpp F16 passes if its max abs difference from float32 is at most
   ``F16_TOLERANCE_FACTOR`` x that emulation's, and it never disagrees on the top-1 token where float32's
   top-1 / top-2 margin exceeds twice its own max abs difference. Q8_0 and Q4_0 report the same figures against
   float32: that is quantization's own error, split into the weights' part (the float32 model with the file's
   weights dequantized by ``gguf``) and what llama.cpp adds to it (llama.cpp also quantizes the activations of a
   Q8_0 / Q4_0 matmul to 8-bit blocks: its Q8_0 model computes W8A8).
5. Times decode, batch 1: one ``Llama`` per (quantization, threads) with ``n_threads = n_threads_batch``, all
   loaded first (load time = the constructor's wall clock, file in the page cache, mmap), then ``--rounds``
   rounds in rotating order; each round resets the context, evaluates the prompt (prefill, timed apart),
   then ``--warmup`` + ``--steps`` greedy decode steps, one token per ``Llama.eval`` (one ``llama_decode``),
   timed with ``time.perf_counter`` around ``eval`` (the argmax outside the timed region). Reported: median and
   p90 step over every timed step of every round, tokens/s = 1 / median, and llama.cpp's own timing of the
   same steps (``llama_perf_context``: ``t_eval_ms / n_eval``). Every round's greedy tokens are checked
   against the configuration's first round (llama.cpp is deterministic at a fixed thread count) and compared
   with the float32 model's greedy tokens (the first divergence is reported). The CPU time other processes
   took during each round (``/proc/stat`` minus this process) is recorded: the box may be shared; rounds where
   they kept fewer than ``QUIET_OTHERS_CORES`` busy are the quiet rounds, and their median is reported apart.

``--keep DIR`` keeps the checkpoint, the GGUF files and the float32 logits; a later run with the same model,
prompt, quantizations and library versions and ``--keep DIR`` reuses them (steps 1-3 and PyTorch are skipped;
llama.cpp is checked against the stored float32 logits again before it is timed), for re-timing on a quieter
machine without rebuilding.

Writes ``benchmarks/results/llamacpp_peer_<shape>.{json,md}`` (shape: ``qwen2_0.5b``, ``qwen2_0.5b_<N>layers``
or ``tiny``), overwritten in place. Needs the ``peers`` extra (``llama-cpp-python``, ``gguf``); not part of
``make test`` or ``make bench``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"

QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                 tie_word_embeddings=True, rms_norm_eps=1e-6)
TINY = dict(QWEN2_05B, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=352, vocab_size=1024)
QUANTS = ("f16", "q8_0", "q4_0")
#: llama.cpp F16 may differ from float32 by at most this many times the float16 emulation's difference (see
#: the module docstring): the emulation rounds where llama.cpp rounds, but not in the same order (llama.cpp
#: keeps RoPE'd K in F16, accumulates its F16 dot products in its own blocking, computes softmax and RMSNorm
#: in its own order), so its error is the same size, not the same numbers.
F16_TOLERANCE_FACTOR = 3.0
#: a round is "quiet" when other processes kept fewer cores than this busy during it (the box may be shared)
QUIET_OTHERS_CORES = 0.25
N_SPECIAL = 3 + 256  # <unk>, <s>, </s>, then <0x00>..<0xFF>


# ---------------------------------------------------------------------------------------------- the model


def build_model(config_kwargs: dict[str, Any], seed: int, perturb: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)  # as benchmarks/real_width.py builds it
    model = model.float().eval().requires_grad_(False)
    if perturb:
        gen = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def load_reference(checkpoint: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    return model.eval().requires_grad_(False)


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    # the decode cache's keyword: ``cache`` from transformers 5.24, ``past_key_values`` before
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(torch.tensor([prompt]), use_cache=True)
    past, tokens = getattr(out, key), []
    token = int(out.logits[0, -1].argmax())
    for _ in range(steps):
        tokens.append(token)
        out = model(torch.tensor([[token]]), use_cache=True, **{key: past})
        past, token = getattr(out, key), int(out.logits[0, -1].argmax())
    return tokens


@torch.no_grad()
def teacher_forced_logits(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def f16_emulation_logits(model: torch.nn.Module, ids: list[int]) -> dict[str, np.ndarray]:
    """The reference with llama.cpp's F16 roundings: weights (in place: call this last), then also every
    Linear's input and the K/V projections' outputs (the KV cache)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.copy_(module.weight.half().float())
    weights_only = teacher_forced_logits(model, ids)
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_pre_hook(lambda m, args: (args[0].half().float(),)))
            if name.endswith(("k_proj", "v_proj")):
                handles.append(module.register_forward_hook(lambda m, args, out: out.half().float()))
    try:
        emulated = teacher_forced_logits(model, ids)
    finally:
        for h in handles:
            h.remove()
    return {"f16_weights": weights_only, "f16_emulation": emulated}


@torch.no_grad()
def dequantized_logits(checkpoint: Path, path: Path, mapping: dict[str, str], ids: list[int]) -> np.ndarray:
    """The float32 model with every weight replaced by the GGUF file's, dequantized by the ``gguf`` package: the
    weights llama.cpp computes with, in PyTorch's float32 arithmetic."""
    import gguf

    model = load_reference(checkpoint)
    params = dict(model.named_parameters())  # the tied lm_head is model.embed_tokens.weight here
    for tensor in gguf.GGUFReader(str(path)).tensors:
        target = params[mapping[tensor.name]]
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        target.copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(target.shape))
    logits = teacher_forced_logits(model, ids)
    del model
    return logits


# ---------------------------------------------------------------------------------------------- GGUF


def write_gguf_f16(checkpoint: Path, config: dict[str, Any], path: Path) -> dict[str, Any]:
    import gguf
    from safetensors import safe_open

    layers = config["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.QWEN2
    names = gguf.get_tensor_name_map(arch, layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name("superkernel random Qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    vocab = config["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), vocab)]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - N_SPECIAL))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(vocab)])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)

    written: dict[str, str] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(file), framework="np") as f:
            for hf_name in f.keys():
                if hf_name == "lm_head.weight":  # tied: llama.cpp reads token_embd as the output matrix
                    continue
                base, _, suffix = hf_name.rpartition(".")
                gguf_base = names.get_name(base)
                if gguf_base is None:
                    raise KeyError(f"no GGUF name for {hf_name}")
                array = f.get_tensor(hf_name)
                array = array.astype(np.float16 if array.ndim == 2 else np.float32)
                writer.add_tensor(f"{gguf_base}.{suffix}", array)
                written[f"{gguf_base}.{suffix}"] = hf_name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def quantize(src: Path, dst: Path, quant: str, pure: bool, threads: int) -> float:
    import llama_cpp

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama_model_quantize logs every tensor
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[quant]
    params.nthread = threads
    params.pure = pure
    start = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({quant}) returned {rc}")
    return time.perf_counter() - start


def describe_gguf(path: Path) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    kinds: dict[str, dict[str, int]] = {}
    per_tensor = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        entry = kinds.setdefault(kind, {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += int(t.n_bytes)
        per_tensor[t.name] = kind
    special = {name: per_tensor[name] for name in ("token_embd.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight")
               if name in per_tensor}
    return {"file_bytes": path.stat().st_size, "tensor_bytes": sum(e["bytes"] for e in kinds.values()),
            "types": kinds, "examples": special}


# ---------------------------------------------------------------------------------------------- llama.cpp


def open_llama(path: Path, threads: int, n_ctx: int, logits_all: bool, flash_attn: bool):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                           n_batch=max(n_ctx, 32), logits_all=logits_all, flash_attn=flash_attn, verbose=False)


def llama_logits(llm, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Prompt as one batch, then one token per llama_decode; the rows of every position."""
    llm.reset()
    llm.eval(prompt)
    for token in continuation:
        llm.eval([token])
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float32)


def compare(reference: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    diff = np.abs(reference - other)
    ref_top = reference.argmax(-1)
    agree = ref_top == other.argmax(-1)
    ref_sorted = np.sort(reference, axis=-1)
    margin = ref_sorted[:, -1] - ref_sorted[:, -2]
    # KL(p_ref || p_other) per position, in nats
    ref_log = reference - np.logaddexp.reduce(reference, axis=-1, keepdims=True)
    oth_log = other - np.logaddexp.reduce(other, axis=-1, keepdims=True)
    kl = (np.exp(ref_log) * (ref_log - oth_log)).sum(-1)
    cos = (reference * other).sum(-1) / (np.linalg.norm(reference, axis=-1) * np.linalg.norm(other, axis=-1))
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()),
            "top1_agree": int(agree.sum()), "positions": int(agree.size),
            "disagree_positions": [int(i) for i in np.nonzero(~agree)[0]],
            "disagree_margins": [float(margin[i]) for i in np.nonzero(~agree)[0]],
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "cosine_min": float(cos.min()),
            "logit_std": float(reference.std()), "reference_margin_median": float(np.median(margin))}


# ---------------------------------------------------------------------------------------------- timing


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle


def others_cores(wall0: float, busy0: int, self0: float) -> float:
    """Cores other processes kept busy since (wall0, busy0, self0): all CPU time minus this process's."""
    wall = time.perf_counter() - wall0
    other = (busy_jiffies() - busy0) / os.sysconf("SC_CLK_TCK") - (_self_cpu() - self0)
    return max(0.0, other / wall)


def decode_round(llm, prompt: list[int], warmup: int, steps: int, forced: list[int] | None = None,
                 logits: list[np.ndarray] | None = None) -> dict[str, Any]:
    """One round: the prompt, then ``warmup`` + ``steps`` decode steps of one token each, the timed ones after the
    warm-up. Greedy by default (each step fed the previous step's argmax); ``forced``: step i is fed ``forced[i]``
    instead (teacher-forced, the ids the torch runners are fed). ``picks``: each step's argmax, read outside the
    timed region; ``logits`` (a list): each step's logits row is appended to it (copied, also untimed)."""
    import llama_cpp

    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    ctx = llm.ctx
    token = int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(llm.n_vocab(),))))
    tokens, picks, times = [], [], []
    for i in range(warmup + steps):
        if i == warmup:
            llama_cpp.llama_perf_context_reset(ctx)
        if forced is not None:
            token = int(forced[i])
        tokens.append(token)
        start = time.perf_counter()
        llm.eval([token])
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(llm.n_vocab(),))
        token = int(np.argmax(row))
        picks.append(token)
        if logits is not None:
            logits.append(np.array(row, dtype=np.float32))
    perf = llama_cpp.llama_perf_context(ctx)
    return {"prefill_s": prefill, "step_s": times, "tokens": tokens, "picks": picks,
            "llama_perf": {"t_eval_ms": perf.t_eval_ms, "n_eval": perf.n_eval}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---------------------------------------------------------------------------------------------- main


STATE_VERSION = 1


def prepare(args, config: dict[str, Any], quants: list[str], threads: list[int], workdir: Path,
            report: dict[str, Any]) -> dict[str, Any]:
    """Steps 1-3 and the PyTorch side of step 4: the model, its checkpoint, the reference tokens and logits, the
    GGUF files and the PyTorch logits they are compared with. With ``--keep DIR``, a DIR prepared by an earlier run
    with the same model, prompt, quantizations and library versions is reused (``--rebuild`` refuses it): only
    llama.cpp is then run again, checked against the stored float32 logits first."""
    import gguf  # noqa: F401  (import errors were reported before)
    import llama_cpp

    timed_tokens = max(args.warmup + args.steps, args.check_steps)
    key = {"state": STATE_VERSION, "config": config, "seed": args.seed, "perturb": not args.no_perturb,
           "pure": args.pure, "prompt": args.prompt, "check_steps": args.check_steps,
           "llama_cpp_python": llama_cpp.__version__, "gguf": _version("gguf"), "torch": torch.__version__,
           "transformers": _version("transformers")}
    state_file, arrays_file = workdir / "state.json", workdir / "reference.npz"
    files = {q: workdir / f"model-{q}.gguf" for q in quants}
    if args.keep is not None and not args.rebuild and state_file.exists() and arrays_file.exists():
        state = json.loads(state_file.read_text())
        arrays = np.load(arrays_file)
        usable = (state["key"] == key and len(state["f32_greedy"]) >= timed_tokens
                  and all(q in state["quants"] and files[q].exists() for q in quants))
        if usable:
            print(f"[reuse] {workdir}: checkpoint, GGUF files and float32 logits of an earlier run "
                  f"({state['written']})", flush=True)
            report.update(state["report"])
            report["reused_from"] = {"dir": str(workdir), "written": state["written"]}
            return {"prompt": state["prompt"], "check_tokens": state["check_tokens"],
                    "f32_greedy": state["f32_greedy"], "ids": state["ids"], "ref_logits": arrays["ref_logits"],
                    "torch_logits": {k[len("torch_"):]: arrays[k] for k in arrays.files if k.startswith("torch_")},
                    "files": files}
        print(f"[reuse] {workdir}: prepared for another configuration; rebuilding", flush=True)

    # 1-2: the model, its checkpoint, the reference
    t0 = time.perf_counter()
    model = build_model(config, args.seed, perturb=not args.no_perturb)
    checkpoint = workdir / "hf"
    model.save_pretrained(checkpoint, safe_serialization=True)
    del model
    reference = load_reference(checkpoint)
    print(f"[model] {report['shape']}: {sum(p.numel() for p in reference.parameters()) / 1e6:.1f} M parameters, "
          f"checkpoint {time.perf_counter() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(args.seed)
    prompt = [int(x) for x in rng.integers(N_SPECIAL, config["vocab_size"], size=args.prompt)]
    f32_greedy = greedy(reference, prompt, timed_tokens)
    check_tokens = f32_greedy[: args.check_steps]
    ids = prompt + check_tokens[:-1]  # the rows of ids predict check_tokens (from position prompt-1 on)
    ref_logits = teacher_forced_logits(reference, ids)
    torch_logits = f16_emulation_logits(reference, ids)
    del reference

    # 3: GGUF files
    t0 = time.perf_counter()
    mapping = write_gguf_f16(checkpoint, config, files["f16"])
    made = {"gguf_write_s": time.perf_counter() - t0, "gguf_tensors": len(mapping), "quantize_s": {}}
    for q in quants:
        if q != "f16":
            made["quantize_s"][q] = quantize(files["f16"], files[q], q, args.pure, max(threads))
            torch_logits[f"dequantized_{q}"] = dequantized_logits(checkpoint, files[q], mapping, ids)
    report.update(made)
    if args.keep is not None:
        np.savez(arrays_file, ref_logits=ref_logits, **{f"torch_{k}": v for k, v in torch_logits.items()})
        state_file.write_text(json.dumps({
            "key": key, "quants": quants, "prompt": prompt, "check_tokens": check_tokens, "f32_greedy": f32_greedy,
            "ids": ids, "report": made, "written": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    return {"prompt": prompt, "check_tokens": check_tokens, "f32_greedy": f32_greedy, "ids": ids,
            "ref_logits": ref_logits, "torch_logits": torch_logits, "files": files}


def thread_counts(spec: str) -> list[int]:
    cores = len(os.sched_getaffinity(0))
    counts = []
    for part in spec.split(","):
        n = cores if part == "all" else int(part)
        if n not in counts:
            counts.append(n)
    return counts


def shape_name(args) -> str:
    if args.tiny:
        return "tiny"
    return "qwen2_0.5b" if args.layers == 24 else f"qwen2_0.5b_{args.layers}layers"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--tiny", action="store_true", help="2 layers, hidden 128, vocabulary 1024")
    parser.add_argument("--quants", default="f16,q8_0,q4_0")
    parser.add_argument("--threads", default="1,all")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pure", action="store_true", help="every matrix the named type (llama-quantize --pure)")
    parser.add_argument("--no-perturb", action="store_true", help="keep HF's ones/zeros norms and biases")
    parser.add_argument("--flash-attn", action="store_true", help="llama.cpp flash attention (wrapper default: off)")
    parser.add_argument("--keep", type=Path, help="write the checkpoint, GGUF files and float32 logits here (kept); "
                        "a later run with the same model and --keep DIR reuses them and runs only llama.cpp")
    parser.add_argument("--rebuild", action="store_true", help="with --keep: rebuild even if DIR is reusable")
    parser.add_argument("--name", help="result file stem (default llamacpp_peer_<shape>)")
    args = parser.parse_args(argv)

    quants = [q.strip() for q in args.quants.split(",")]
    bad = [q for q in quants if q not in QUANTS]
    if bad:
        print(f"error: --quants {','.join(bad)}: allowed {','.join(QUANTS)}", file=sys.stderr)
        return 2
    if "f16" not in quants:
        quants.insert(0, "f16")  # the quantized files are made from it and it is the correctness check
    try:
        import gguf
        import llama_cpp
    except ImportError as err:
        print(f"error: {err}; install the peers extra: pip install -e '.[peers]'", file=sys.stderr)
        return 2

    threads = thread_counts(args.threads)
    config = dict(TINY) if args.tiny else dict(QWEN2_05B, num_hidden_layers=args.layers)
    shape = shape_name(args)
    stem = args.name or f"llamacpp_peer_{shape}"
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    report: dict[str, Any] = {
        "shape": shape, "config": config, "seed": args.seed, "perturbed_norms_and_biases": not args.no_perturb,
        "prompt_tokens": args.prompt, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "check_steps": args.check_steps, "pure": args.pure, "flash_attn": args.flash_attn,
        "versions": {"llama_cpp_python": llama_cpp.__version__, "gguf": _version("gguf"),
                     "torch": torch.__version__, "transformers": _version("transformers"),
                     "python": platform.python_version()},
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "cpu": _cpu_name(), "cores": len(os.sched_getaffinity(0)), "load_avg_start": os.getloadavg(),
    }
    workdir_ctx = tempfile.TemporaryDirectory(prefix="llamacpp_peer_") if args.keep is None else None
    workdir = Path(workdir_ctx.name) if workdir_ctx else args.keep
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        prep = prepare(args, config, quants, threads, workdir, report)
        prompt, check_tokens, f32_greedy = prep["prompt"], prep["check_tokens"], prep["f32_greedy"]
        ids, ref_logits, torch_logits, files = prep["ids"], prep["ref_logits"], prep["torch_logits"], prep["files"]
        report["files"] = {q: describe_gguf(files[q]) for q in quants}
        for q in quants:
            f = report["files"][q]
            print(f"[gguf] {q}: {f['tensor_bytes'] / 2**20:.1f} MiB, types "
                  + ", ".join(f"{k} x{v['tensors']}" for k, v in f["types"].items()), flush=True)

        # 4: correctness
        check: dict[str, Any] = {}
        ranges = {"all": slice(0, len(ids)), "prefill": slice(0, args.prompt),
                  "generated": slice(args.prompt - 1, len(ids))}
        for name in ("f16_weights", "f16_emulation"):
            check[name] = {r: compare(ref_logits[s], torch_logits[name][s]) for r, s in ranges.items()}
        for q in quants:
            llm = open_llama(files[q], max(threads), n_ctx=len(ids) + 8, logits_all=True, flash_attn=args.flash_attn)
            got = llama_logits(llm, prompt, check_tokens[:-1])
            del llm
            check[q] = {r: compare(ref_logits[s], got[s]) for r, s in ranges.items()}
            if q != "f16":  # split quantization's error: the weights alone, then what llama.cpp adds
                deq = torch_logits[f"dequantized_{q}"]
                check[f"torch_{q}_weights"] = {r: compare(ref_logits[s], deq[s]) for r, s in ranges.items()}
                check[f"{q}_vs_torch_{q}_weights"] = {r: compare(deq[s], got[s]) for r, s in ranges.items()}
        bound = F16_TOLERANCE_FACTOR * check["f16_emulation"]["all"]["max_abs"]
        f16 = check["f16"]["all"]
        strict_wrong = [i for i, m in zip(f16["disagree_positions"], f16["disagree_margins"])
                        if m > 2 * f16["max_abs"]]
        verdict = {"tolerance": bound, "max_abs": f16["max_abs"],
                   "within_tolerance": f16["max_abs"] <= bound, "top1_disagreements_beyond_margin": strict_wrong,
                   "passed": f16["max_abs"] <= bound and not strict_wrong}
        report["correctness"] = check
        report["f16_verdict"] = verdict
        for name in check:
            c = check[name]["all"]
            print(f"[check] {name:29s} max|d| {c['max_abs']:.3e}  mean|d| {c['mean_abs']:.3e}  top-1 "
                  f"{c['top1_agree']}/{c['positions']}  KL {c['kl_mean']:.2e}", flush=True)
        print(f"[check] F16 {'PASSED' if verdict['passed'] else 'FAILED'}: max|d| {verdict['max_abs']:.3e} "
              f"<= {bound:.3e} ({F16_TOLERANCE_FACTOR} x the float16 emulation's)", flush=True)
        if not verdict["passed"]:
            report["timing"] = "not run: llama.cpp F16 failed the correctness check"
            return _write(report, stem, 1)

        # 5: timing
        n_ctx = args.prompt + args.warmup + args.steps + 8
        instances, loads = {}, {}
        for q in quants:
            for t in threads:
                start = time.perf_counter()
                instances[(q, t)] = open_llama(files[q], t, n_ctx=n_ctx, logits_all=False, flash_attn=args.flash_attn)
                loads[(q, t)] = time.perf_counter() - start
        keys = list(instances)
        rounds: dict[tuple[str, int], list[dict[str, Any]]] = {k: [] for k in keys}
        load_before = os.getloadavg()
        wall0, busy0, self0 = time.perf_counter(), busy_jiffies(), _self_cpu()
        for r in range(args.rounds):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            for key in order:
                w0, b0, s0 = time.perf_counter(), busy_jiffies(), _self_cpu()
                result = decode_round(instances[key], prompt, args.warmup, args.steps)
                result["others_cores"] = others_cores(w0, b0, s0)
                rounds[key].append(result)
            print(f"[time] round {r + 1}/{args.rounds}: "
                  + ", ".join(f"{q}/{t}t {statistics.median(rounds[(q, t)][-1]['step_s']) * 1e3:.2f} ms"
                              for q, t in keys), flush=True)
        wall = time.perf_counter() - wall0
        hz = os.sysconf("SC_CLK_TCK")
        others = ((busy_jiffies() - busy0) / hz - (_self_cpu() - self0)) / wall
        report["timing_environment"] = {
            "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "wall_s": wall,
            "other_processes_cores": max(0.0, others),
            "note": "shared machine: other_processes_cores is the CPU other processes used during the timing, "
                    "in cores (from /proc/stat minus this process)"}
        timing = []
        for q, t in keys:
            rs = rounds[(q, t)]
            steps = [s for rr in rs for s in rr["step_s"]]
            perf_ms = [rr["llama_perf"]["t_eval_ms"] / max(1, rr["llama_perf"]["n_eval"]) for rr in rs]
            first = rs[0]["tokens"]
            consistent = all(rr["tokens"] == first for rr in rs)
            diverge = next((i for i, (a, b) in enumerate(zip(first, f32_greedy)) if a != b), None)
            med = statistics.median(steps)
            quiet = [i for i, rr in enumerate(rs) if rr["others_cores"] < QUIET_OTHERS_CORES]
            quiet_med = statistics.median([x for i in quiet for x in rs[i]["step_s"]]) * 1e3 if quiet else None
            timing.append({
                "quant": q, "threads": t, "load_s": loads[(q, t)], "median_step_ms": med * 1e3,
                "p90_step_ms": percentile(steps, 0.9) * 1e3, "mean_step_ms": statistics.fmean(steps) * 1e3, "min_step_ms": min(steps) * 1e3,
                "tokens_per_s": 1.0 / med, "round_medians_ms": [statistics.median(rr["step_s"]) * 1e3 for rr in rs],
                "round_means_ms": [statistics.fmean(rr["step_s"]) * 1e3 for rr in rs],
                "llama_perf_ms_per_token": perf_ms, "prefill_ms": [rr["prefill_s"] * 1e3 for rr in rs],
                "tokens_consistent_across_rounds": consistent,
                "first_divergence_from_f32_greedy": diverge,
                "weight_gib_per_s": report["files"][q]["tensor_bytes"] / med / 2**30,
                "round_others_cores": [rr["others_cores"] for rr in rs],
                "best_round_median_ms": min(statistics.median(rr["step_s"]) for rr in rs) * 1e3,
                "quiet_rounds": quiet, "quiet_median_ms": quiet_med})
        report["timing"] = timing
        return _write(report, stem, 0)
    finally:
        if workdir_ctx is not None:
            workdir_ctx.cleanup()


def _version(dist: str) -> str:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:
        return "?"


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _write(report: dict[str, Any], stem: str, rc: int) -> int:
    report["load_avg_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(report))
    print(f"wrote {RESULTS / stem}.{{json,md}}")
    return rc


def label_of(name: str) -> str:
    """A row label of the correctness table."""
    fixed = {"f16_weights": "torch, F16-rounded weights", "f16_emulation": "torch, F16 emulation"}
    if name in fixed:
        return fixed[name]
    if name.startswith("torch_"):
        return f"torch, {name.split('_')[1].upper()}_0-dequantized weights"
    if "_vs_torch_" in name:
        q = name.split("_vs_")[0].upper()
        return f"llama.cpp {q} **vs torch with its dequantized weights**"
    return f"llama.cpp {name.upper()}"


def markdown(r: dict[str, Any]) -> str:
    c = r["config"]
    lines = [
        f"# llama.cpp peer: {r['shape']}",
        "",
        f"`benchmarks/llamacpp_peer.py`: Qwen2ForCausalLM, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, intermediate {c['intermediate_size']}, "
        f"vocabulary {c['vocab_size']}, tied embeddings; seeded random weights (seed {r['seed']}"
        + (", norms and q/k/v biases perturbed" if r["perturbed_norms_and_biases"] else "") + "), float32 reference "
        "in eager attention from the saved safetensors checkpoint; GGUF F16 written with the `gguf` package, Q8_0 / "
        f"Q4_0 by llama.cpp's `llama_model_quantize`{' (--pure)' if r['pure'] else ' (its default per-tensor types)'}.",
        "",
        f"llama-cpp-python {r['versions']['llama_cpp_python']}, gguf {r['versions']['gguf']}, torch "
        f"{r['versions']['torch']}, transformers {r['versions']['transformers']}. CPU: {r['cpu']}, {r['cores']} cores. "
        f"llama.cpp: `{r['system_info']}`. Flash attention {'on' if r['flash_attn'] else 'off'}.",
        "",
        "## Files",
        "",
        "| type | tensor MiB | tensor types |",
        "|---|---:|---|",
    ]
    for q, f in r.get("files", {}).items():
        types = ", ".join(f"{k} x{v['tensors']}" for k, v in f["types"].items())
        lines.append(f"| {q} | {f['tensor_bytes'] / 2**20:.1f} | {types}; token_embd {f['examples'].get('token_embd.weight')} |")
    if "correctness" in r:
        v = r["f16_verdict"]
        lines += [
            "",
            f"## Correctness (prompt {r['prompt_tokens']} tokens + {r['check_steps'] - 1} teacher-forced steps of the "
            "float32 greedy continuation; every position's next-token logits vs float32 eager)",
            "",
            "| against float32 (unless named) | positions | max abs | mean abs | top-1 agree | KL mean (nats) | min cosine | "
            "generated: max abs | generated: top-1 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, cc in r["correctness"].items():
            a, g = cc["all"], cc["generated"]
            label = label_of(name)
            lines.append(f"| {label} | {a['positions']} | {a['max_abs']:.3e} | {a['mean_abs']:.3e} | "
                         f"{a['top1_agree']}/{a['positions']} | {a['kl_mean']:.2e} | {a['cosine_min']:.6f} | "
                         f"{g['max_abs']:.3e} | {g['top1_agree']}/{g['positions']} |")
        lines += [
            "",
            f"F16 check: max abs {v['max_abs']:.3e} against a tolerance of {v['tolerance']:.3e} "
            f"({F16_TOLERANCE_FACTOR} x the float16 emulation's max abs difference), top-1 disagreements where "
            f"float32's top-1/top-2 margin exceeds twice that difference: {len(v['top1_disagreements_beyond_margin'])}"
            f" -> **{'passed' if v['passed'] else 'FAILED'}**.",
            "",
            "The llama.cpp Q8_0 / Q4_0 rows against float32 are quantization's own error. It splits into the weights' "
            "rounding alone (*torch, ..-dequantized weights*: the file's weights dequantized by the `gguf` package, "
            "run in PyTorch float32) and what llama.cpp's arithmetic adds to it (*vs torch with its dequantized "
            "weights*: mostly the activations, which llama.cpp quantizes to 8 bits (Q8_0 blocks) for every Q8_0 / "
            "Q4_0 matmul). Random weights give nearly flat logits: the float32 model's median top-1/top-2 margin is "
            f"{r['correctness']['f16']['all']['reference_margin_median']:.3f} (logit std "
            f"{r['correctness']['f16']['all']['logit_std']:.3f}), so top-1 agreement here is a harsher test than on a "
            "trained model; read it with the KL and the max difference.",
        ]
    if isinstance(r.get("timing"), list):
        env = r["timing_environment"]
        lines += [
            "",
            f"## Decode, batch 1 (prompt {r['prompt_tokens']}, {r['warmup']} warm-up + {r['steps']} timed steps, "
            f"{r['rounds']} rotating rounds)",
            "",
            "Step = wall clock around `Llama.eval([token])` (one `llama_decode`, which returns with the step "
            "computed on the CPU backend). A round is *quiet* when other processes kept fewer than "
            f"{QUIET_OTHERS_CORES} cores busy during it (`/proc/stat` minus this process): on a shared machine the "
            "quiet-round median is the figure to compare; the all-round median is beside it.",
            "",
            "| type | threads | quiet rounds | quiet median ms | quiet tokens/s | all rounds: median ms | p90 ms | "
            "best round median ms | weight GiB/s (quiet) | load s | prefill ms (median) | greedy = f32 for |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for t in r["timing"]:
            div = t["first_divergence_from_f32_greedy"]
            same = "all steps" if div is None else f"{div} steps"
            if not t["tokens_consistent_across_rounds"]:
                same += " (rounds differ!)"
            quiet = t["quiet_median_ms"]
            tensor_bytes = r["files"][t["quant"]]["tensor_bytes"]
            q_cells = (f"{quiet:.2f} | {1e3 / quiet:.1f}" if quiet else "- | -")
            gib = f"{tensor_bytes / (quiet / 1e3) / 2**30:.1f}" if quiet else "-"
            lines.append(
                f"| {t['quant']} | {t['threads']} | {len(t['quiet_rounds'])}/{len(t['round_medians_ms'])} | {q_cells} | "
                f"{t['median_step_ms']:.2f} | {t['p90_step_ms']:.2f} | {t['best_round_median_ms']:.2f} | {gib} | "
                f"{t['load_s']:.2f} | {statistics.median(t['prefill_ms']):.1f} | {same} |")
        lines += [
            "",
            "Per round (in the order timed): median step ms (other processes' cores) / llama.cpp's own ms per token "
            "(`llama_perf_context` t_eval_ms / n_eval: a mean from decode start to the next synchronisation, here "
            "the logits read right after; compare it with the round's mean, in the JSON, not its median).",
            "",
            "| type | threads | rounds: median ms (others' cores) | llama.cpp's own mean ms/token |",
            "|---|---:|---|---|",
        ]
        for t in r["timing"]:
            per_round = ", ".join(f"{m:.1f} ({o:.2f})" for m, o in zip(t["round_medians_ms"], t["round_others_cores"]))
            own = ", ".join(f"{x:.1f}" for x in t["llama_perf_ms_per_token"])
            lines.append(f"| {t['quant']} | {t['threads']} | {per_round} | {own} |")
        lines += [
            "",
            f"Machine load: 1-min load average {env['load_avg_before'][0]:.2f} before, {env['load_avg_after'][0]:.2f} "
            f"after the timing; other processes kept {env['other_processes_cores']:.2f} cores busy on average during "
            f"it ({r['cores']}-core machine, shared). Load = `Llama(...)` constructor, GGUF in the page cache (mmap); "
            "weight GiB/s = the file's tensor bytes (every matrix is read once a step; the tied embedding is the "
            "output matrix) / quiet median step.",
        ]
    elif "timing" in r:
        lines += ["", f"Timing: {r['timing']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
