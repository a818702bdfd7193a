"""The README and the docs run as written: every bash block, every shown output, every
python block (tests/doc_pages.py: README.md, then the site's pages in nav order).

Each bash block runs, in the pages' order, through `bash -e` in a scratch copy of
the project's experiments/ (so runs/ and the experiment trees are the test's own),
with the venv's bin first on PATH as `source .venv/bin/activate` puts it. Only the
number of rounds shrinks (shrink(): a run's `rounds=N` becomes max(2, ceil(N / 50)),
a run that sets none gets 2; an experiment script's `--rounds` likewise, and a paper
script runs its first seed and level only: one_seed_and_level()), except
where a command reuses the committed results (`--out experiments/...`), which runs
exactly as written. `~/data` is a scratch folder holding stand-in MNIST IDX files
(MNIST itself is not installed here). Not run, and why, in NOT_RUN. A block whose
`$ command` is followed by its output is run and its output compared. The python
blocks run page by page, as written (Extending's are tests/test_readme_extending.py's).
"""

import gzip
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from tests.doc_pages import ROOT, blocks, runnable_pages
from tests.helpers import cpu_devices_env

BIN = os.path.dirname(sys.executable)
FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"

# commands the test does not run, and why
NOT_RUN = {
    "make ": "CI runs `make test` and `make test-slow` itself; `make demo` is `fedjax-dp run "
             "--config experiments/demo.yaml`, run below",
    "tensorboard ": "TensorBoard is not a dependency; the test checks that the folder it would "
                    "read holds event files",
}


def block_groups() -> dict[str, list[tuple[int, str]]]:
  """The bash blocks in groups that run on their own: each experiment script's block
  (its runs are many, and need nothing else), and all the others, in order."""
  groups: dict[str, list] = {}
  for where, body in blocks("bash"):
    scripts = set(re.findall(r"python (experiments/\S+\.py)", body))
    commands = [l for l in logical_lines(body) if l.strip() and not l.strip().startswith("#")]
    own = len(scripts) == 1 and all("python experiments/" in c for c in commands)
    groups.setdefault(scripts.pop() if own else "the other blocks, in order", []).append(
        (where, body))
  return groups


def logical_lines(body: str) -> list[str]:
  return body.replace("\\\n", " ").splitlines()


def fewer(n: int) -> int:
  return max(2, math.ceil(n / 50))


def shrink(line: str) -> str:
  """A README line with fewer rounds (see the module docstring)."""
  code, sep, comment = line.partition(" #")
  stripped = code.strip()
  for prefix in NOT_RUN:
    if stripped.startswith(prefix):
      if prefix == "tensorboard ":
        folder = stripped.split("--logdir", 1)[1].split()[0]
        return f'ls {folder}/events.out.tfevents.* > /dev/null'
      return f"# not run: {NOT_RUN[prefix]}"
  code = code.replace("~/data", '"$README_DATA"')
  if "--out experiments/" in code:
    return code   # reuses the committed results: as written
  background = code.rstrip().endswith("&")
  body = code.rstrip().rstrip("&")
  if re.search(r"fedjax-dp (run|sweep)\b", body):
    body, n = re.subn(r"\brounds=(\d+)", lambda m: f"rounds={fewer(int(m.group(1)))}", body)
    if not n and "--resume" not in body:
      body += " --set rounds=2"
  elif re.search(r"python experiments/\S+\.py", body):
    body, n = re.subn(r"--rounds (\d+)", lambda m: f"--rounds {fewer(int(m.group(1)))}", body)
    if not n and "--resume" not in body:
      body += " --rounds 2"
    if any(f"python {script}" in body for script in PAPER_SCRIPTS):
      body = one_seed_and_level(body)
  return body + (" &" if background else "")


def one_seed_and_level(body: str) -> str:
  """A paper script's command on its first seed and first heterogeneity level: each
  seed and level is the same code path on other numbers (the scripts' own tests run
  several), and they were most of the blocks' runs."""
  body = re.sub(r"--(seeds|levels) (\S+)(?: (?!-)\S+)*", r"--\1 \2", body)
  return body if "--seeds" in body else body + " --seeds 0"


def write_idx(folder: str, prefix: str, n: int, rng) -> None:
  """Stand-in IDX files: n random 28x28 images and labels 0..9."""
  images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
  labels = (np.arange(n) % 10).astype(np.uint8)
  with gzip.open(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
  with gzip.open(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
    f.write(struct.pack(">II", 2049, n) + labels.tobytes())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  if not os.path.exists(FMNIST):
    pytest.skip("the README's commands need Fashion-MNIST: make fmnist-data")
  work = tmp_path_factory.mktemp("readme")
  shutil.copytree(os.path.join(ROOT, "experiments"), work / "experiments")
  os.symlink(os.path.dirname(BIN), work / ".venv")   # `source .venv/bin/activate`
  data = work / "data"
  os.makedirs(data / "mnist")
  rng = np.random.default_rng(0)
  write_idx(str(data / "mnist"), "train", 2000, rng)
  write_idx(str(data / "mnist"), "t10k", 500, rng)
  # the suite's 8 CPU devices, asked through FEDJAX_DP_CPU_DEVICES so that a command
  # setting it itself gets its own count
  env = cpu_devices_env(8, PATH=f"{BIN}:{os.environ['PATH']}", README_DATA=str(data),
                        PYTHONPATH=ROOT)
  return work, env


def run_bash(script: str, work, env, timeout=1200):
  return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_bash_blocks_are_complete():
  assert len(blocks("bash")) >= 20 and len(block_groups()) >= 3
  for where, body in blocks("bash"):
    for line in logical_lines(body):
      code = "" if line.lstrip().startswith("#") else line.partition(" #")[0]
      assert "..." not in code, f"{where}: an incomplete command: {line}"
      assert re.search(r"\.venv/bin/(?!activate)", code) is None, (
          f"{where}: call fedjax-dp and python from the activated venv: {line}")


# The paper scripts' blocks rerun the papers' experiments at 2 rounds: 69 minutes of
# CPU on all seeds and levels (2026-11-28, on 2 busy cores), over half of what CI's 90
# minutes hold; one seed and level cut the TopkSDP-FL block, not the dynamic-DP one
# (its large protocol's runs are one seed already). `make test-long`
# runs them, not CI; each script's own tests (test_experiments.py,
# test_adversarial_experiment.py, ...) run its commands at a small size in CI.
PAPER_SCRIPTS = ("experiments/topksdp/run.py", "experiments/dynamic_dp/run.py",
                 "experiments/adversarial/run.py")


@pytest.mark.slow   # the other blocks: every other command of the README
@pytest.mark.parametrize("group", [
    pytest.param(g, marks=pytest.mark.long) if g in PAPER_SCRIPTS else g
    for g in sorted(block_groups())])
def test_every_bash_block_runs(group, workdir, tmp_path):
  work, env = workdir
  here = tmp_path / "work"   # each group in a copy of its own (they run side by side)
  shutil.copytree(work, here, symlinks=True)
  for where, body in block_groups()[group]:
    script = "\n".join(shrink(line) for line in logical_lines(body))
    done = run_bash(script, here, env, timeout=2400)
    assert done.returncode == 0, (f"the block at {where} failed "
                                  f"({done.returncode}):\n{script}\n{done.stderr[-3000:]}")
    for expected in re.findall(r"^# -> (.*)$", body, re.M):   # a line the block prints
      # '...' in a shown line stands for what differs between machines (a float's last
      # digits, a path)
      pattern = re.escape(expected.strip()).replace(re.escape("..."), ".*")
      assert re.search(pattern, done.stdout), (where, expected, done.stdout[-2000:])


@pytest.mark.slow
def test_shown_outputs_are_what_the_commands_print(workdir):
  work, env = workdir
  shown = [(n, b) for n, b in blocks("") if b.startswith("$ ")]
  assert len(shown) >= 2
  for where, body in shown:
    command, *output = body.rstrip("\n").split("\n")
    done = run_bash(command[2:], work, env)
    printed = (done.stdout + done.stderr).strip().splitlines()
    for want in output:   # '...' stands for the absolute path of the folder
      pattern = re.escape(want).replace(re.escape("..."), ".*")
      assert any(re.fullmatch(pattern, got) for got in printed), (where, want, printed)


EXTENDING = "docs/how-to/extend.md"   # tests/test_readme_extending.py runs its blocks


def python_sections() -> dict[str, list[tuple[str, str]]]:
  """Each page's python blocks (a page's blocks build on one another), but Extending's."""
  out: dict[str, list] = {}
  for page in runnable_pages():
    if page != EXTENDING and blocks("python", page):
      out[page] = blocks("python", page)
  return out


@pytest.mark.slow
@pytest.mark.parametrize("section", sorted(python_sections()))
def test_python_blocks_run_as_written(section, workdir, tmp_path):
  work, env = workdir
  here = tmp_path / "work"
  shutil.copytree(work / "experiments", here / "experiments")
  script = "\n".join(body for _, body in python_sections()[section])
  done = subprocess.run([sys.executable, "-c", script], cwd=here, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert done.returncode == 0, (section, done.stderr[-3000:])
