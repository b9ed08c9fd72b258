"""Our number/date/symbol rules against WeTextProcessing's text normalisers, on bench/text_corpus.txt.

    pip install wetext WeTextProcessing        # only for this comparison, not project dependencies
    python -m bench text-compare [--repeat 3] [--examples 4] [--json out.json]

Each engine runs in its own fresh interpreter (so its peak RSS and load time are its own): ours
(``normalize_numbers_zh`` / ``normalize_numbers_en``, the pass that WeTextProcessing would
replace), ``wetext`` (WeTextProcessing's runtime: prebuilt FSTs on kaldifst) and
``wetextprocessing`` (the pynini grammar package). Outputs are compared after reducing both to
what is spoken: lower case, letters and ideographs only, punctuation and spacing ignored. Digits
left in an output are counted apart: ChatTTS cannot say them and drops them.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

CORPUS_PATH = Path(__file__).resolve().parents[1] / "text_corpus.txt"
ENGINES = ("ours", "wetext", "wetextprocessing")


def load_corpus(path: Path = CORPUS_PATH) -> List[Tuple[str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            lang, text = line.split("\t", 1)
            rows.append((lang, text))
    return rows


def _build(engine: str) -> Dict[str, Callable[[str], str]]:
    if engine == "ours":
        from serve_app.engine.text import normalize_numbers_en, normalize_numbers_zh

        return {"zh": normalize_numbers_zh, "en": normalize_numbers_en}
    if engine == "wetext":
        from wetext import Normalizer

        return {lang: Normalizer(lang=lang, operator="tn").normalize for lang in ("zh", "en")}
    if engine == "wetextprocessing":
        from tn.chinese.normalizer import Normalizer as ZhNormalizer
        from tn.english.normalizer import Normalizer as EnNormalizer

        return {"zh": ZhNormalizer().normalize, "en": EnNormalizer().normalize}
    raise ValueError(f"unknown engine {engine!r}")


def _rss_mib() -> float:
    """Peak RSS of this process image (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_engine(engine: str, repeat: int) -> dict:
    """In this process: load ``engine``, normalise the corpus ``repeat`` times (after one warm pass)."""
    corpus = load_corpus()
    rss0 = _rss_mib()
    start = time.perf_counter()
    fns = _build(engine)
    load_s = time.perf_counter() - start
    outputs = [fns[lang](text) for lang, text in corpus]  # warm pass (lazy tables, caches)
    start = time.perf_counter()
    for _ in range(repeat):
        for lang, text in corpus:
            fns[lang](text)
    run_s = time.perf_counter() - start
    return {
        "engine": engine,
        "load_s": load_s,
        "sentences_per_s": repeat * len(corpus) / run_s,
        "rss_before_mib": rss0,
        "rss_peak_mib": _rss_mib(),
        "outputs": outputs,
    }


def spoken(text: str) -> str:
    """What a reading says, for comparison: words and the ideographs ChatTTS says, nothing else."""
    # Imported here, not at the top: each worker's load time and RSS must include our package.
    from serve_app.engine.text.chars import SAYABLE_CJK

    return " ".join(re.findall(f"[{SAYABLE_CJK}]|[a-z]+", text.lower()))


def compare(corpus: List[Tuple[str, str]], results: Dict[str, dict], n_examples: int) -> dict:
    ours = results["ours"]["outputs"]
    summary = {}
    for engine, res in results.items():
        entry = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items() if k != "outputs"}
        entry["left_digits"] = sum(bool(re.search(r"\d", o)) for o in res["outputs"])
        if engine != "ours":
            diffs = [i for i, (a, b) in enumerate(zip(ours, res["outputs"])) if spoken(a) != spoken(b)]
            entry["disagree"] = {lang: sum(corpus[i][0] == lang for i in diffs) for lang in ("zh", "en")}
            entry["examples"] = [
                {"input": corpus[i][1], "ours": " ".join(ours[i].split()), engine: res["outputs"][i]}
                for lang in ("zh", "en")
                for i in [j for j in diffs if corpus[j][0] == lang][:n_examples]
            ]
        summary[engine] = entry
    return summary


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over the corpus per engine")
    ap.add_argument("--examples", type=int, default=4, help="disagreements shown per language")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--json", help="write the whole comparison here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one engine, print JSON


def main(args: argparse.Namespace) -> int:
    if args.worker:
        print(json.dumps(run_engine(args.worker, args.repeat), ensure_ascii=False))
        return 0
    # A worker imports nothing of the bench beyond this module: its RSS is the engine's.
    from ..lib.procs import REPO_ROOT, bench_command

    corpus = load_corpus()
    results = {}
    for engine in args.engines.split(","):
        # A fresh interpreter per engine (its load time and peak RSS its own); ``python -m bench``
        # imports only the subcommand it runs.
        proc = subprocess.run(
            bench_command("text-compare", "--worker", engine, "--repeat", str(args.repeat)),
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        )
        if proc.returncode:
            print(f"{engine}: failed (not installed?)\n{proc.stderr.strip()[-600:]}", file=sys.stderr)
            continue
        results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    if "ours" not in results:
        return 1
    summary = compare(corpus, results, args.examples)
    print(f"corpus: {len(corpus)} sentences ({sum(lang == 'zh' for lang, _ in corpus)} zh)")
    print("| engine | load s | sentences/s | peak RSS MiB (before load) | outputs with digits | disagree zh / en |")
    print("|---|---|---|---|---|---|")
    for engine, e in summary.items():
        dis = e.get("disagree")
        disagree = f"{dis['zh']} / {dis['en']}" if dis else "-"
        print(
            f"| {engine} | {e['load_s']:.2f} | {e['sentences_per_s']:.0f} | {e['rss_peak_mib']:.0f} "
            f"({e['rss_before_mib']:.0f}) | {e['left_digits']} | {disagree} |"
        )
    for e in summary.values():
        for ex in e.get("examples", []):
            print(json.dumps(ex, ensure_ascii=False))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, ensure_ascii=False, indent=1), encoding="utf-8")
    return 0
