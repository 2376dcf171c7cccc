"""A fed GPU (issue 31, part 4): a ResNet-50 training step fed four ways, and a GPT-2-small step.

Rows (images/s and the GPU's busy share: CUDA events around each step, summed, over the wall time
of the measured steps, after --warmup steps):
- (a) torchvision ``ImageFolder`` + ``DataLoader(num_workers=N, pin_memory=True)``, the ImageNet
  example's ``RandomResizedCrop(224)`` + flip + ``ToTensor`` + ``Normalize`` in the workers;
- (b) ``TarIterable`` over the converted shards, Pillow decode + crop + flip in the workers
  (``JpegCollate(then=DecodeAugment(device="cpu"))``), uint8 to the device, normalized there;
- (c) ``TarIterable`` shipping the JPEG bytes, decoded by nvJPEG (``torchvision.io.decode_jpeg``,
  a batch at once) and cropped on the GPU, as the ``DevicePrefetcher``'s transform;
- (d) DALI's file reader pipeline: left out (its wheel is far too big to carry to the device);
- GPT-2 small (124M, plain torch, seq 1024) fed by ``TokenBatches`` through the prefetcher: tokens/s.
The model step: bf16 autocast, channels-last, SGD (ResNet) / AdamW (GPT-2); on a CPU, fp32.
Every epoch restarts the workers (persistent_workers=False, as the ImageNet example): the rows pay it alike.

The data: --images JPEGs from bench/images.py (ImageNet-thumbnail-like, mostly 500x375, quality 85,
100 classes, seeded) under --workdir, converted by ``python -m shardsmith convert --to webdataset``;
token ids written directly (seeded). Results: a markdown table, and JSON in $OUT (else --workdir).

Device command (one H200, 16 cores, no network; fits 10 minutes: ~3 estimated, not yet measured,
and each row stops measuring after --max-row-seconds). Here, with network: ``bash
bench/gpu_wheels.sh`` fills the git-ignored .whl/ (cp312, ~12 MB); then run(carry=[".whl"],
timeout_s=570):

    python -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:. \
        python bench/bench_gpu_feed.py --workdir /tmp/gpu-feed

CPU smoke check (tiny models, no torchvision needed: row (a) then says it is not installed):

    PYTHONPATH=. .venv/bin/python bench/bench_gpu_feed.py --device cpu --images 512 --steps 4 \
        --warmup 1 --batch-size 32 --workers 2 --gpt-batch 2 --gpt-seq 128
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import code_version, key_figure  # noqa: E402
from images import ensure_imagefolder  # noqa: E402

from shardsmith.core import manifest  # noqa: E402
from shardsmith.formats.tokens.dataset import TokenDataset  # noqa: E402
from shardsmith.formats.tokens.writer import idx_bytes  # noqa: E402
from shardsmith.formats.webdataset.dataset import TarDataset  # noqa: E402
from shardsmith.kit import manifest_io  # noqa: E402
from shardsmith.torch import (  # noqa: E402
    DecodeAugment,
    DevicePrefetcher,
    JpegCollate,
    RandomResizedCropFlip,
    TarIterable,
    TokenBatches,
    to_model_input,
)

CLASSES = 100


# -- data -------------------------------------------------------------------------------------------

def image_data(work: Path, n: int, workers: int) -> Path:
    """The ImageFolder (reused when complete) and its tar shards (converted once per folder)."""
    folder, shards = work / "imagefolder", work / "shards"
    info = ensure_imagefolder(folder, n, classes=CLASSES)
    stamp = shards / ".from.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == info):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "shardsmith", "convert", str(folder), "-o", str(shards),
                        "--to", "webdataset", "--workers", str(workers), "--overwrite", "-q"], check=True)
        stamp.write_text(json.dumps(info))
        print(f"converted {n:,} JPEGs ({info['bytes'] / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
    return shards


def token_data(work: Path, *, tokens: int, vocab: int, seed: int = 0) -> Path:
    """Random token ids (uint16) in 2 Megatron shards and a manifest, as pack-tokens lays them out."""
    import hashlib

    out = work / f"tokens-{tokens}-{vocab}"
    if (out / "manifest.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(seed).integers(0, vocab, tokens, dtype=np.uint16)
    (out / "tokenizer.json").write_text("{}")
    entries = []
    for s, part in enumerate(np.array_split(ids, 2)):
        b, i = out / f"train-{s:05d}.bin", out / f"train-{s:05d}.idx"
        b.write_bytes(part.tobytes())
        i.write_bytes(idx_bytes(np.array([len(part)]), np.dtype(np.uint16)))
        sha = [hashlib.sha256(f.read_bytes()).hexdigest() for f in (b, i)]
        entries.append({"path": b.name, "samples": 1, "bytes": b.stat().st_size, "sha256": sha[0], "tokens": len(part),
                        "index": {"path": i.name, "bytes": i.stat().st_size, "sha256": sha[1]}})
    tok = {"path": "tokenizer.json", "sha256": hashlib.sha256(b"{}").hexdigest(), "vocab_size": vocab,
           "dtype": "uint16"}
    manifest_io.save(out, manifest.new_manifest(
        fmt="tokens", seed=seed, shuffle=True, source={"reader": "bench", "inputs": []}, schema={},
        splits={"train": {"samples": 2, "shards": entries}}, tokenizer=tok, seq_len=1024))
    return out


# -- models -------------------------------------------------------------------------------------------

def image_model(name: str) -> torch.nn.Module:
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(num_classes=1000)
    return torch.nn.Sequential(  # tiny: the CPU smoke check
        torch.nn.Conv2d(3, 16, 3, stride=4), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=4),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, CLASSES))


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    """GPT-2 (small: 12 layers, 12 heads, 768 wide, 124M parameters with tied embeddings)."""

    def __init__(self, *, vocab: int, seq: int, layers: int = 12, heads: int = 12, d: int = 768) -> None:
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


# -- timing -------------------------------------------------------------------------------------------

def forever(make, epochs_from: int = 0):
    """Batches of epoch after epoch: ``make(epoch)`` gives one epoch's iterable."""
    epoch = epochs_from
    while True:
        yield from make(epoch)
        epoch += 1


def measure(batches, step, *, device: torch.device, warmup: int, steps: int, per_step, limit: float) -> dict:
    """Run ``warmup`` then ``steps`` steps (fewer if they pass ``limit`` seconds: the device run
    must fit its 10 minutes); the measured steps' wall time, and the time inside ``step`` (CUDA
    events on the current stream; on a CPU, the clock)."""
    cuda = device.type == "cuda"
    it = iter(batches)
    for _ in range(warmup):
        step(next(it))
    if cuda:
        torch.cuda.synchronize(device)
    spans, count, t0 = [], 0, time.perf_counter()
    for _ in range(steps):
        if time.perf_counter() - t0 > limit:
            break
        batch = next(it)
        count += per_step(batch)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(batch)
            end.record()
            spans.append((start, end))
        else:
            s = time.perf_counter()
            step(batch)
            spans.append(time.perf_counter() - s)
    if cuda:
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    busy = sum(s.elapsed_time(e) / 1e3 for s, e in spans) if cuda else sum(spans)
    return {"wall_s": round(wall, 3), "steps": len(spans), "items": count, "per_s": round(count / wall, 1),
            "busy": round(busy / wall, 3)}


def image_step(model, opt, device: torch.device):
    cuda = device.type == "cuda"

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = batch
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# -- rows ---------------------------------------------------------------------------------------------

def loader(dataset, args, **kw) -> torch.utils.data.DataLoader:
    extra = {"prefetch_factor": 2} if args.workers else {}
    return torch.utils.data.DataLoader(dataset, num_workers=args.workers, persistent_workers=False, **extra, **kw)


def row_a(args, device, folder: Path):
    import torchvision
    from torchvision import transforms as T

    tf = T.Compose([T.RandomResizedCrop(args.size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dl = loader(torchvision.datasets.ImageFolder(str(folder), tf), args, batch_size=args.batch_size, shuffle=True,
                drop_last=True, pin_memory=device.type == "cuda")

    def move(b):
        x = b[0].to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        return x, b[1].to(device, non_blocking=True)

    def batches():
        for b in forever(lambda e: dl):
            yield move(b)

    return batches()


def row_b(args, device, shards: Path):
    crop = RandomResizedCropFlip(args.size, seed=0)
    tar = TarIterable(TarDataset(shards), batch_size=args.batch_size, seed=0, drop_last=True,
                      collate=JpegCollate(then=DecodeAugment(crop=crop, device="cpu")))
    dl = loader(tar, args, batch_size=None, pin_memory=device.type == "cuda")
    feed = DevicePrefetcher(dl, device=device, transform=lambda b: (
        to_model_input(b["image"], dtype=torch.bfloat16 if device.type == "cuda" else torch.float32), b["label"]))

    def epoch(e):
        feed.set_epoch(e)  # the TarIterable's order
        crop.set_epoch(e)  # the crops (the workers take a copy at each epoch's start)
        return feed

    return forever(epoch)


def row_c(args, device, shards: Path):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    crop = RandomResizedCropFlip(args.size, seed=0)
    gpu = DecodeAugment(crop=crop, device=device, normalize=True, dtype=dtype,
                        channels_last=True)
    tar = TarIterable(TarDataset(shards), batch_size=args.batch_size, seed=0, drop_last=True, collate=JpegCollate())
    feed = DevicePrefetcher(loader(tar, args, batch_size=None), device=device,
                            transform=lambda b: (lambda o: (o["image"], o["label"]))(gpu(b)))

    def epoch(e):
        feed.set_epoch(e)
        crop.set_epoch(e)
        return feed

    return forever(epoch)


def image_rows(args, device, rows: dict) -> None:
    folder = args.workdir / "imagefolder"
    shards = image_data(args.workdir, args.images, args.workers or 1)
    name = args.model if args.model != "auto" else ("resnet50" if device.type == "cuda" else "tiny")
    on = "nvJPEG decode + GPU crop" if device.type == "cuda" else "Pillow decode + crop in the main process"
    feeds = {"a": ("(a) torchvision ImageFolder + DataLoader", row_a, folder),
             "b": ("(b) TarIterable, CPU decode in workers", row_b, shards),
             "c": (f"(c) TarIterable, {on}", row_c, shards)}
    for key, (label, make, path) in feeds.items():
        if key not in args.rows:
            continue
        needs_tv = key == "a" or name == "resnet50" or (key == "c" and device.type == "cuda")
        if needs_tv and _missing("torchvision"):
            rows[label] = {"note": "torchvision not installed"}
            continue
        torch.manual_seed(0)
        model = image_model(name).to(device).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        batches = make(args, device, path)
        try:
            r = measure(batches, image_step(model, opt, device), device=device, warmup=args.warmup,
                        steps=args.steps, per_step=lambda b: len(b[1]), limit=args.max_row_seconds)
        except Exception as e:  # one row's failure leaves the others' figures (one device run)
            traceback.print_exc()
            rows[label] = {"note": f"failed: {' '.join(str(e).split())[:200]}"}
            continue
        finally:
            batches.close()  # ends the epoch's iteration: its workers exit
        rows[label] = {**r, "unit": "images/s", "model": name, "batch": args.batch_size}
        print(f"  {label}: {r}", flush=True)
        del batches, model, opt


def gpt_row(args, device, rows: dict) -> None:
    small = device.type == "cuda" and args.gpt_model == "auto" or args.gpt_model == "small"
    vocab = 50304
    seq = args.gpt_seq
    shape = {} if small else {"layers": 2, "heads": 2, "d": 64}
    need = (args.warmup + args.steps + 1) * args.gpt_batch * seq * 2
    ds = TokenDataset(token_data(args.workdir, tokens=max(need, 1 << 20), vocab=vocab), seq_len=seq)
    dl = loader(TokenBatches(ds, batch_size=args.gpt_batch, seed=0), args, batch_size=None,
                pin_memory=device.type == "cuda")
    feed = DevicePrefetcher(dl, device=device)
    torch.manual_seed(0)
    model = GPT(vocab=vocab, seq=seq, **shape).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    cuda = device.type == "cuda"

    def step(batch) -> None:
        x, y = batch
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def epoch(e):
        feed.set_epoch(e)
        return feed

    r = measure(forever(epoch), step, device=device, warmup=args.warmup, steps=args.steps,
                per_step=lambda b: b[0].numel(), limit=args.max_row_seconds)
    params = sum(p.numel() for p in model.parameters())
    label = f"GPT-2 {'small' if small else 'tiny'} ({params / 1e6:.0f}M), TokenBatches + prefetcher"
    rows[label] = {**r, "unit": "tokens/s", "model": f"gpt2-{'small' if small else 'tiny'}",
                   "batch": f"{args.gpt_batch}x{seq}"}
    print(f"  {label}: {r}", flush=True)


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except (ImportError, RuntimeError):
        return True
    return False


def table(rows: dict) -> str:
    lines = ["| feed | model | batch | throughput | GPU busy | measured |", "|---|---|---|---|---|---|"]
    for label, r in rows.items():
        if "note" in r:
            lines.append(f"| {label} | | | {r['note']} | | |")
            continue
        lines.append(f"| {label} | {r['model']} | {r['batch']} | {r['per_s']:,.0f} {r['unit']} | "
                     f"{100 * r['busy']:.0f} % | {r['steps']} steps, {r['wall_s']:.1f} s |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-bench/gpu-feed"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--steps", type=int, default=100, help="measured steps per row (default 100)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DataLoader workers (default: all cores)")
    ap.add_argument("--model", choices=["auto", "resnet50", "tiny"], default="auto",
                    help="auto: resnet50 on CUDA, tiny on a CPU")
    ap.add_argument("--gpt-model", choices=["auto", "small", "tiny"], default="auto")
    ap.add_argument("--gpt-batch", type=int, default=16)
    ap.add_argument("--gpt-seq", type=int, default=1024)
    ap.add_argument("--rows", default="a,b,c,gpt", help="which rows (default a,b,c,gpt)")
    ap.add_argument("--max-row-seconds", type=float, default=90.0,
                    help="stop a row's measured steps after this long (its table row says how many ran)")
    args = ap.parse_args()
    args.rows = set(args.rows.split(","))
    device = torch.device(args.device)
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    tv = "absent" if _missing("torchvision") else __import__("torchvision").__version__
    print(f"{code_version()}; torch {torch.__version__}, torchvision {tv}, device {device} ({gpu}), "
          f"{os.cpu_count()} cores, {args.workers} workers")
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    if shm is not None:  # DataLoader workers hand batches over in /dev/shm: a container's 64 MB will not do
        free = shm.f_bavail * shm.f_frsize
        print(f"/dev/shm: {free / 2**30:.1f} GiB free" + ("  (small: the workers' batches may not fit)"
                                                          if free < 4 * 2**30 else ""))
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    t0 = time.perf_counter()
    rows: dict = {}
    if args.rows & {"a", "b", "c"}:
        image_rows(args, device, rows)
    rows["(d) DALI file reader pipeline"] = {"note": "not run: DALI's wheel is too big to carry to the device"}
    if "gpt" in args.rows:
        try:
            gpt_row(args, device, rows)
        except Exception as e:
            traceback.print_exc()
            rows["GPT-2, TokenBatches + prefetcher"] = {"note": f"failed: {' '.join(str(e).split())[:200]}"}
    out = table(rows)
    print(f"\n{out}\n\nGPU busy: CUDA events around each step, summed, over the measured wall time "
          f"({args.steps} steps after {args.warmup}); on a CPU the step's own clock. "
          f"Total {time.perf_counter() - t0:.0f} s.")
    for label, r in rows.items():
        if "per_s" in r:
            key_figure(label, f"{r['per_s']:,.0f} {r['unit']}, GPU busy {100 * r['busy']:.0f} %")
    report = {"args": {k: (sorted(v) if isinstance(v, set) else str(v) if isinstance(v, Path) else v)
                       for k, v in vars(args).items()},
              "torch": torch.__version__, "torchvision": tv, "device": gpu, "code": code_version(), "rows": rows}
    dest = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.workdir
    (dest / "bench_gpu_feed.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {dest / 'bench_gpu_feed.json'}; load average at end: {os.getloadavg()}")
    if not all(math.isfinite(r.get("per_s", 0.0)) for r in rows.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
