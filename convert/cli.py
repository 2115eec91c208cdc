"""`python -m convert`: command line, order of work, and one-line errors.

Order: check the output folder and arguments, resolve the sources, read the base model's
config (refusing unsupported architectures), convert the drafter first (small, and checked
against the base model before any heavy work), then the tokenizer, then the base weights,
then the manifest; all inside a staging folder that becomes the output only at the end.
"""

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Optional

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from redrafter_mlx import _platform  # noqa: E402,F401  (OpenBLAS before mlx)
from redrafter_mlx.cli import Parser, add_version, describe, write_failure  # noqa: E402
from redrafter_mlx.errors import RedrafterError, one_line  # noqa: E402

from . import PROG  # noqa: E402
from .output import CancelledAfterWriting, OutputFolder, exit_code, signal_name, signals_stop  # noqa: E402

EXAMPLES = """\
examples:
  # a Hugging Face checkpoint (folder or hub id) and Apple's ReDrafter head, float16
  python -m convert --model lmsys/vicuna-7b-v1.3 --drafter ./redrafter-vicuna-7b \\
      --chat-template vicuna --dtype float16 --out models/vicuna-7b
  # the same, 4-bit (group size 64)
  python -m convert --model ./vicuna-7b-v1.3 --drafter ./redrafter-vicuna-7b \\
      --chat-template vicuna --quantize --q-bits 4 --q-group-size 64 --out models/vicuna-7b-4bit
  # a llama GGUF file, keeping its quantization (or --dtype float32 to dequantize)
  python -m convert --model SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2
  # only a drafter, checked against the model it is for (into MODEL/drafter, --force to replace
  # the one there: MODEL/manifest.json then names the new one)
  python -m convert --drafter ./redrafter-vicuna-7b --base models/vicuna-7b --out models/vicuna-7b/drafter
  # then
  python -m redrafter_mlx --model models/vicuna-7b "Hello!"
  redrafter-chat --model models/vicuna-7b

The output folder holds config.json, model*.safetensors, the tokenizer (tokenizer.json,
tokenizer_config.json with the chat template), generation_config.json (the source's, where it
has one; a GGUF's is written from its tokenizer), optionally drafter/,
and manifest.json (sources, sha256 of the inputs, dtype, quantization, tool versions).
It loads with redrafter_mlx.load(PATH) and with mlx_lm.load(PATH). It is written into a hidden
folder beside it and renamed into place at the end: an error, Ctrl-C, SIGTERM or SIGHUP leaves
nothing (with --force, the old folder stays until the new one is whole).
.bin/.pt inputs are read with torch.load(weights_only=True) (pip install 'redrafter-mlx[convert]');
no code from a checkpoint is ever run.
"""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Convert a model of a supported family (Hugging Face checkpoint or llama GGUF) and Apple's ReDrafter "
        "draft head into one MLX model folder for redrafter_mlx (and mlx-lm); or, with --base, convert a drafter alone "
        "for a model already converted.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version(p)
    src = p.add_argument_group("inputs")
    src.add_argument("--model", metavar="SRC",
                     help="base model: Hugging Face folder or hub id (config.json, model*.safetensors or "
                          "pytorch_model*.bin, tokenizer files), a llama .gguf file, or a registry name "
                          "(smollm2-135m)")
    src.add_argument("--drafter", metavar="SRC",
                     help="Apple ReDrafter checkpoint: folder (or file) with config.json and model.safetensors, "
                          "pytorch_model.bin or model.pt, or a hub id of one (a drafter already in redrafter_mlx's "
                          "format works too)")
    src.add_argument("--base", metavar="MODEL",
                     help="with --drafter and no --model: the model the drafter is for (converted folder, "
                          ".gguf, registry name or hub id); the output is then the drafter folder alone")
    out = p.add_argument_group("output")
    out.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder, which must not exist unless --force: the converted model, or with --base the drafter alone "
                          "(MODEL/drafter is where redrafter_mlx finds it by itself)")
    out.add_argument("--force", action="store_true",
                     help="replace an existing output folder (a model or drafter folder only; an --out that is a "
                          "symbolic link is followed: the folder it points to is replaced, the link stays)")
    out.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                     help="weights' dtype, the drafter's too (default: the base model's config.json torch_dtype, "
                          "the drafter as stored; a quantized model, GGUF or folder, keeps its quantization unless a dtype "
                          "is given: then it is dequantized)")
    out.add_argument("--quantize", "-q", action="store_true",
                     help="quantize the base model with mlx-lm (a GGUF is first dequantized, to --dtype or else "
                          "float16; an already quantized folder needs --dtype, to which it is first dequantized; the "
                          "drafter is not quantized)")
    out.add_argument("--q-bits", type=int, choices=[2, 3, 4, 5, 6, 8], help="with --quantize: bits per weight (default 4)")
    out.add_argument("--q-group-size", type=int, choices=[32, 64, 128],
                     help="with --quantize: quantization group size, the weights that share a scale (default 64); "
                          "it must divide the layers' input widths (a size that leaves layers unquantized where "
                          "another would not is refused)")
    out.add_argument("--chat-template", metavar="NAME|FILE",
                     help="chat template to store with the tokenizer: 'vicuna' or a Jinja file "
                          "(default: the checkpoint's own)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars or status lines (notes on the result and errors are still said)")
    return p


class Reporter:
    """Status lines and tqdm bars on stderr (bars only on a terminal)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet

    def say(self, text: str):
        if not self.quiet:
            print(f"[convert] {text}", file=sys.stderr, flush=True)

    def note(self, text: str):
        """What the user should know of the result, said with --quiet too."""
        print(f"[convert] note: {text}", file=sys.stderr, flush=True)

    def bar(self, total=None, desc="", unit="tensor", unit_scale=False):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                    disable=True if self.quiet else None,
                    leave=True, dynamic_ncols=True)


def _check_args(p: argparse.ArgumentParser, args):
    for option in ("model", "drafter", "base", "out", "chat_template"):
        # ("$MODEL" unset: "" was the folder you are in, or no option at all, and --chat-template "" was ignored)
        if getattr(args, option) is not None and not getattr(args, option).strip():
            p.error(f"--{option.replace('_', '-')} is empty")
    if not args.model and not args.drafter:
        p.error("nothing to convert: give --model (and optionally --drafter), or --drafter with --base")
    if args.base and args.model:
        p.error("--base is for converting a drafter alone; with --model the drafter is checked against that model")
    if args.drafter and not args.model and not args.base:
        p.error("--drafter alone needs --base MODEL (the model it is for) to check it against")
    if not args.model and (args.quantize or args.chat_template):
        p.error("--quantize and --chat-template apply to a base model (--model)")
    if (args.q_bits or args.q_group_size) and not args.quantize:
        p.error("--q-bits and --q-group-size need --quantize")
    args.q_bits = args.q_bits or 4
    args.q_group_size = args.q_group_size or 64


def _base_args_of(name: str):
    """ModelArgs of the model a drafter is for (only its config is read), refusing an architecture
    redrafter_mlx cannot run as converting that model would; and that model, resolved as load() resolves it."""
    from redrafter_mlx import registry
    from redrafter_mlx.gguf import read_gguf_config

    from .base_model import check_architecture
    from .checkpoint import is_hub_id, read_json, resolve

    if is_hub_id(name) and not registry.looks_like_path(name):  # (org/name.gguf is a missing local file)
        # its config.json alone: the whole repository was fetched (gigabytes of weights) to read it
        folder = resolve(name, "base model", config_only=True)
        return (check_architecture(read_json(folder / "config.json", "model"), str(folder / "config.json")),
                registry.ResolvedModel(name, folder))
    resolved = registry.resolve(name)
    if resolved.kind == "gguf":
        config, where = read_gguf_config(resolved.path), resolved.path.name  # (its header: no tensor is read)
    else:
        registry.refuse_gguf_folder(resolved.path, "--base")  # (read_json said "has no config.json: not a model folder")
        where = resolved.path / "config.json"
        config = read_json(where, "model")
    return check_architecture(config, str(where)), resolved


def _files_info(info: Dict[str, Any], root: Optional[Path], report: Reporter) -> Dict[str, Any]:
    """The manifest's entry, with the sha256 of every input, under a bar counting bytes (at the
    ~600 MB/s measured here, a 70B model's 140 GB is minutes of hashing)."""
    from .output import describe_inputs

    info = dict(info)
    files = sorted(set(Path(f) for f in info.pop("files")))
    bar = report.bar(total=sum(f.stat().st_size for f in files), desc="hashing", unit="B", unit_scale=True)
    try:
        info["sha256"] = describe_inputs(files, root, bar.update)
    finally:
        bar.close()
    return info


def _record_drafter(target: Path, info: Dict[str, Any], report: Reporter):
    """A drafter converted alone into MODEL/drafter: MODEL's manifest.json names it (it went on naming the
    drafter converted with the model, hashes and all; redrafter-train's install does the same)."""
    from redrafter_mlx.files import model_manifest_of, record_drafter

    manifest = model_manifest_of(target)
    if manifest is None:
        return
    failed = record_drafter(manifest, info)
    if failed:
        report.note(failed)
    else:
        report.say(f"{manifest} now names this drafter")


@contextlib.contextmanager
def hub_bars(shown: bool):
    """huggingface-hub's download bars, hidden when `shown` is False (--quiet: they showed through it)."""
    if shown:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if are_progress_bars_disabled():  # (HF_HUB_DISABLE_PROGRESS_BARS, or a caller's choice: left as it is)
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def _note_drafter_left(name: str, path: Path, out: Path, report: Reporter):
    """A model converted without --drafter that has one (MODEL/drafter, X.drafter beside a GGUF, a registry model's
    shipped one: what load() would find) gave a folder without it, saying nothing, and speculation was then off."""
    from redrafter_mlx import registry
    from redrafter_mlx.loader import find_drafter

    left = find_drafter(registry.ResolvedModel(name, path, registry.known_models().get(name, {})))
    if left is not None:
        report.note(f"the drafter {left} is not copied, so {out} loads without one: add --drafter "
                    f"{shlex.quote(str(left))} to bring it along")


def _found_by_load(base_model, target: Path) -> bool:
    """Whether load(--base) finds the drafter just written by itself (MODEL/drafter, X.drafter beside X.gguf): the
    command to try then needs no --drafter (it gave one wherever the drafter went)."""
    from redrafter_mlx.loader import find_drafter

    try:
        found = find_drafter(base_model)
    except OSError:  # (the drafter is written: a folder beside it that cannot be read is no failure of this)
        return False
    return found is not None and os.path.realpath(found) == os.path.realpath(target)


def run(args, report: Reporter) -> Path:
    from .base_model import check_options, convert_base, open_base
    from .checkpoint import DRAFTER_FILES, _torch, is_hub_id, resolve
    from .drafter import convert_drafter
    from .output import write_manifest
    from .tokenizer import read_chat_template

    output = OutputFolder(args.out, force=args.force)
    if output.target != output.path:
        report.say(f"output: {output.shown}; writing there, the link stays")
    template = read_chat_template(args.chat_template)
    base = drafter_src = None

    def drafter_source() -> Path:
        found = resolve(args.drafter, "drafter", drafter=True)
        stored = [found] if found.is_file() else [found / n for n in DRAFTER_FILES]
        if next((f for f in stored if f.is_file()), found).suffix in (".bin", ".pt"):
            _torch()
        return found

    if args.drafter and args.model and is_hub_id(args.model):
        # (a drafter that cannot be read was refused after the hub model's download: gigabytes)
        drafter_src = drafter_source()
    if args.model:
        source = resolve(args.model, "model")
        base = open_base(source)
        check_options(base, args.dtype, args.quantize)
        output.protect(base.path)
        report.say(f"base model: {base.path} ({base.kind}, {base.args.num_hidden_layers} layers, "
                   f"hidden {base.args.hidden_size}, vocabulary {base.args.vocab_size})")
        base_args = base.args
    else:
        base_args, base_model = _base_args_of(args.base)
        base_path = base_model.path
        output.protect(base_path)
        report.say(f"drafter for: {base_path}")
    if args.drafter:
        drafter_src = drafter_src or drafter_source()
        output.protect(drafter_src)
        if base is not None:
            output.keep_drafter(replaced=True)
    elif base is not None:
        output.keep_drafter()
        _note_drafter_left(args.model, base.path, output.path, report)

    with output as tmp:
        drafter_info = None
        if drafter_src is not None:
            dest = tmp / "drafter" if base is not None else tmp / "drafter.tmp"
            report.say(f"drafter: {drafter_src}")
            advice = None if base is not None else f"give --base the model it was trained for (not {base_path})"
            drafter_info = convert_drafter(drafter_src, dest, base_args, args.dtype, report, advice)
            if base is None:  # the output folder is the drafter folder itself
                for f in dest.iterdir():
                    f.rename(tmp / f.name)
                dest.rmdir()
            drafter_info = _files_info(drafter_info, drafter_src if drafter_src.is_dir() else None, report)
            if base is None:
                drafter_info["checked_against"] = str(base_path)
                output.then.append(lambda: _record_drafter(output.path, drafter_info, report))
        base_info = None
        if base is not None:
            base_info = convert_base(base, tmp, args.dtype, args.quantize, args.q_bits, args.q_group_size, template,
                                     report)
            if not base_info["chat_template"]:  # a chat model's messages then go to it as bare text, saying nothing
                report.note(f"{base.path} has no chat template, so chat messages reach the model as plain text: for a "
                            "chat model give --chat-template (vicuna, or a Jinja file)")
            report.say("hashing inputs for the manifest")
            base_info = _files_info(base_info, base.path if base.path.is_dir() else None, report)
        write_manifest(tmp, base_info, drafter_info)
    if base is None:
        args.found_by_load = _found_by_load(base_model, output.target)
    return output.path  # (a link as given: it stays, and leads to the output)


def main(argv=None) -> int:
    # SIGTERM and SIGHUP stop it as Ctrl-C does from the start: before the output folder's handlers were installed
    # (the arguments read, the model resolved, fetched, opened), one ended the process saying nothing
    with signals_stop():
        try:
            p = build_parser()
            args = p.parse_args(argv)
            _check_args(p, args)
            report = Reporter(args.quiet)
            with hub_bars(not args.quiet):
                target = run(args, report)
        except RedrafterError as e:
            print(f"{PROG}: error: {one_line(e, limit=2000)}", file=sys.stderr)  # our own message, whole
            return 2
        except CancelledAfterWriting as e:
            print(f"{PROG}: error: {e.signal_name} came as the output was renamed into place; {e.target} is whole",
                  file=sys.stderr)
            return exit_code(e.signal_name)
        except KeyboardInterrupt as e:
            print(f"{PROG}: error: cancelled; nothing was written", file=sys.stderr)
            return exit_code(signal_name(e))
        except MemoryError:
            print(f"{PROG}: error: out of memory; nothing was written", file=sys.stderr)
            return 1
        except OSError as e:  # a file that cannot be read or written, a full disk
            print(f"{PROG}: error: {describe(e)} (nothing was written)", file=sys.stderr)
            return 1
        except Exception as e:  # a bug, or an error from a library this tool does not expect
            said = write_failure(e)  # MLX's writes fail with a RuntimeError: a full disk read as a bug
            if said is not None:
                print(f"{PROG}: error: {said} (nothing was written)", file=sys.stderr)
                return 1
            if os.environ.get("CONVERT_DEBUG"):
                raise
            print(f"{PROG}: error: {type(e).__name__}: {one_line(e)} (nothing was written; CONVERT_DEBUG=1 shows the "
                  "traceback)", file=sys.stderr)
            return 1
    # quoted for a shell: a path with a space in it split into two arguments when pasted
    out = shlex.quote(str(target))
    if args.model:
        try_it = f"--model {out}"
    else:
        try_it = f"--model {shlex.quote(os.path.expanduser(args.base))}"
        if not getattr(args, "found_by_load", False):  # a drafter elsewhere: load() would not find it
            try_it += f" --drafter {out}"
    report.say(f"wrote {target}; try it: python -m redrafter_mlx {try_it} \"Hello!\"")
    return 0
