"""The wheels gear-rl needs on the lent GPU machine, and the size of what travels there.

    python scripts/device_wheels.py                # into .device-wheels/py312; prints the sizes
    python scripts/device_wheels.py --python-version 3.11   # this CPU's python (the rehearsal)
    python scripts/device_wheels.py --size-only    # measure the tree and the wheels only

The lent machine (``/work``'s device tool, docs/verl.md "The lent GPU machine") runs its own
``python3`` (3.12) with torch 2.11.0+cu130, transformers 5.17.0 and the packages of
:data:`LENT_MACHINE_PACKAGES`, and reaches no package registry. Whatever else gear-rl imports
travels beside the working tree as wheels, and the tree plus the wheels must fit in 64 MiB.

What it does: walks gear-rl's requirements (``pyproject.toml``'s ``[project] dependencies``,
markers evaluated for the target python, extras followed): a requirement on a package the machine
has is noted (the rehearsal installs it), any other is fetched with ``pip download --no-deps
--only-binary=:all:`` for ``cp3XX`` / manylinux x86-64 into ``DEST`` and its own ``Requires-Dist``
walked in turn. One version per package: a later requirement that the fetched version does not
meet is an error. Wheels in ``DEST`` that the walk did not ask for are removed (two versions of
one package stop the whole install there). ``DEST/manifest.json`` records the wheels and the
machine-side requirements.

The size: the working tree that travels (tracked files and untracked files git does not ignore,
as ``git ls-files`` lists them; without git, every file under the root but ``.git`` and the
carried wheel folders) plus ``DEST``. Over ``--limit-mib`` (64) it says so and exits 1.
Exit codes: 0 fits, 1 too large, 2 a download or a requirement failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DEST = ".device-wheels"
LIMIT_MIB = 64.0

# The lent machine's Python packages (its image 'cuda', as the device tool's KINDS.md lists them,
# read 2026-11-17). A requirement on one of these is not carried.
def _names(text: str) -> frozenset[str]:
    return frozenset(canonicalize_name(n) for n in text.split())


LENT_MACHINE_PACKAGES = _names("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""")

# Versions read there (KINDS.md's pip list): the rehearsal pins these where PyPI has them.
LENT_MACHINE_VERSIONS = {
    "torch": "2.11.0", "transformers": "5.17.0", "tokenizers": "0.23.2",
    "safetensors": "0.8.0", "accelerate": "1.15.0", "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
}

# What the rehearsal (scripts/device_check.sh --rehearse, on a CPU) installs instead of the
# machine's version, with why: the nearest that a package registry here serves.
REHEARSAL_SUBSTITUTES: dict[str, str | None] = {
    "torch": "2.13.0",  # 2.11.0 on PyPI is a CUDA 13 build (GBs); 2.13.0+cpu is on local disk
    "numpy": None,  # 2.5.2 is not on PyPI yet: the newest there
}

# Imported only where no weights travel: the bundled SmolLM2's GGUF reader. The lent machine's
# check builds its models in place, so this is not carried.
NOT_CARRIED = frozenset({"gguf"})

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def project_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """``[project] dependencies`` of ``pyproject``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def marker_env(python_version: str) -> dict[str, str]:
    """The marker environment of the target: CPython ``python_version`` on Linux x86-64."""
    env = default_environment()
    env.update(python_version=python_version, python_full_version=f"{python_version}.0",
               implementation_name="cpython", platform_python_implementation="CPython",
               sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
               os_name="posix")
    return env


def applies(req: Requirement, env: dict[str, str], extras: Iterable[str]) -> bool:
    """Whether ``req`` holds for the target, with ``extras`` of its parent requested."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (*extras, ""))


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """``Requires-Dist`` of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist()
                    if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = archive.read(name).decode("utf-8", errors="replace")
    head = text.split("\n\n", 1)[0]
    return [Requirement(line.split(":", 1)[1].strip()) for line in head.splitlines()
            if line.startswith("Requires-Dist:")]


def target_python(python_version: str) -> str | None:
    """A CPython ``python_version`` interpreter here (this one, ``pythonX.Y`` on PATH, or a
    pyenv install), to build wheels of source-only packages; None if there is none."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == python_version:
        return sys.executable
    candidates = [shutil.which(f"python{python_version}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    pattern = f"{python_version}.*/bin/python{python_version}"
    candidates += sorted(str(p) for p in pyenv.glob(pattern))
    for exe in filter(None, candidates):
        probe = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == python_version:
            return exe
    return None


def _download(req: Requirement, dest: Path, python_version: str) -> Path:
    """``pip download --no-deps`` one wheel of ``req`` for the target into ``dest``."""
    spec = f"{req.name}{req.specifier}"
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp",
               *[a for p in PLATFORMS for a in ("--platform", p)], "-d", tmp, spec]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0:
            # some packages publish only a source archive: build the wheel here, with the
            # target's python (a C extension such as pycosat 0.6.6 is built for that ABI; this
            # machine's glibc is older than the lent machine's, so what it links runs there)
            builder = target_python(python_version)
            if builder is not None:
                built = subprocess.run([builder, "-m", "pip", "wheel", "-q", "--no-deps",
                                        "-w", tmp, spec], capture_output=True, text=True,
                                       check=False)
                wheels = list(Path(tmp).glob("*.whl"))
                if built.returncode == 0 and len(wheels) == 1:
                    done = built
                else:
                    done = built if built.returncode != 0 else done
        if done.returncode != 0 or len(wheels) != 1:
            raise RuntimeError(f"pip download {spec} for cp{python_version.replace('.', '')} "
                               f"failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-600:]}")
        target = dest / wheels[0].name
        os.replace(wheels[0], target)
    return target


def collect(dest: Path, python_version: str,
            requirements: Sequence[str] | None = None) -> dict[str, object]:
    """Fetch the wheels the lent machine lacks into ``dest``; returns the manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    env = marker_env(python_version)
    have = {parse_wheel_filename(w.name)[0]: w for w in dest.glob("*.whl")}
    carried: dict[str, Path] = {}
    machine: dict[str, list[str]] = {}
    queue: list[tuple[Requirement, tuple[str, ...]]] = [
        (Requirement(r), ()) for r in (requirements or project_requirements())]
    while queue:
        req, parent_extras = queue.pop(0)
        if not applies(req, env, parent_extras):
            continue
        name = canonicalize_name(req.name)
        if name in NOT_CARRIED:
            continue
        if name in LENT_MACHINE_PACKAGES:
            machine.setdefault(name, [])
            if str(req.specifier) and str(req.specifier) not in machine[name]:
                machine[name].append(str(req.specifier))
            continue
        if name in carried:
            version = parse_wheel_filename(carried[name].name)[1]
            if not req.specifier.contains(version, prereleases=True):
                raise RuntimeError(f"{req} is not met by the carried {carried[name].name} "
                                   "(one version of each package can travel)")
        else:
            wheel = have.get(name)
            fits = wheel is not None and req.specifier.contains(
                parse_wheel_filename(wheel.name)[1], prereleases=True)
            wheel = wheel if fits else _download(req, dest, python_version)
            assert wheel is not None
            carried[name] = wheel
            print(f"  carry {wheel.name} ({wheel.stat().st_size / 2**20:.2f} MiB) for {req}")
            for sub in wheel_requirements(wheel):
                queue.append((sub, ()))
        # the requested extras of an already fetched package
        for sub in wheel_requirements(carried[name]) if req.extras else ():
            if sub.marker is not None and applies(sub, env, req.extras) \
                    and not applies(sub, env, ()):
                queue.append((sub, tuple(req.extras)))
    for wheel in dest.glob("*.whl"):
        if wheel not in carried.values():
            print(f"  removed {wheel.name} (not asked for)")
            wheel.unlink()
    manifest: dict[str, object] = {
        "python_version": python_version,
        "wheels": sorted(w.name for w in carried.values()),
        "machine_requirements": {n: ",".join(s) for n, s in sorted(machine.items())},
        "machine_versions": LENT_MACHINE_VERSIONS,
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def rehearsal_requirements(manifest: dict[str, object]) -> list[str]:
    """The machine-side requirements of ``manifest`` as the rehearsal installs them: each at the
    lent machine's version where known (:data:`LENT_MACHINE_VERSIONS`), else at what gear-rl
    asks, with :data:`REHEARSAL_SUBSTITUTES` applied."""
    wanted = dict(manifest["machine_requirements"])  # type: ignore[call-overload]
    lines = []
    for name in sorted({*wanted, "packaging"}):
        pin = REHEARSAL_SUBSTITUTES.get(name, LENT_MACHINE_VERSIONS.get(name))
        if name in REHEARSAL_SUBSTITUTES and pin is None:
            lines.append(f"{name}{wanted.get(name, '')}")
        else:
            lines.append(f"{name}=={pin}" if pin else f"{name}{wanted.get(name, '')}")
    return lines


def _files_under(root: Path, skip: Sequence[Path]) -> Iterable[Path]:
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d != ".git" and here / d not in skip]
        for f in files:
            yield here / f


def tree_bytes(root: Path = REPO, skip: Sequence[Path] = ()) -> tuple[int, str]:
    """Bytes of the working tree that travels, and how they were counted."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=False)
    if listed.returncode == 0:
        names = [n for n in listed.stdout.decode().split("\0") if n]
        total = sum((root / n).lstat().st_size for n in names if (root / n).is_file())
        return total, f"git ls-files: {len(names)} files"
    files = list(_files_under(root, [root / s for s in skip]))
    return sum(f.lstat().st_size for f in files), f"no git here: {len(files)} files under the root"


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def size_report(dest: Path, limit_mib: float = LIMIT_MIB) -> bool:
    """Print the travelling size; True when it fits under ``limit_mib``."""
    tree, how = tree_bytes(REPO, skip=[dest.parent if dest.parent != REPO else dest])
    wheels = folder_bytes(dest) if dest.is_dir() else 0
    total = tree + wheels
    results = REPO / "results"
    results_part = folder_bytes(results) if results.is_dir() else 0
    mib = 2**20
    print(f"travelling size: tree {tree / mib:.1f} MiB ({how}; results/ {results_part / mib:.1f} "
          f"MiB of it) + wheels {wheels / mib:.1f} MiB ({dest.name}) = {total / mib:.1f} MiB of "
          f"the {limit_mib:g} MiB a device call may carry")
    if total > limit_mib * mib:
        print(f"device_wheels: too large to travel: {total / mib:.1f} MiB > {limit_mib:g} MiB. "
              "Make the tree smaller (results/, large untracked files: add them to "
              ".git/info/exclude) or carry fewer wheels", file=sys.stderr)
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12",
                        help="the target python (3.12: the lent machine's)")
    parser.add_argument("--dest", default=None,
                        help=f"wheel folder (default {DEFAULT_DEST}/pyXY)")
    parser.add_argument("--size-only", action="store_true", help="download nothing")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--rehearsal-requirements", action="store_true",
                        help="print the rehearsal's pip requirements from DEST's manifest")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version takes 3.N, got {args.python_version!r}")
    tag = args.python_version.replace(".", "")
    dest = Path(args.dest) if args.dest else REPO / DEFAULT_DEST / f"py{tag}"
    if args.rehearsal_requirements:
        manifest_path = dest / "manifest.json"
        if not manifest_path.is_file():
            print(f"device_wheels: no {manifest_path}: run without --rehearsal-requirements "
                  "first", file=sys.stderr)
            return 2
        print("\n".join(rehearsal_requirements(json.loads(manifest_path.read_text()))))
        return 0
    if not args.size_only:
        print(f"device wheels for cp{tag} manylinux x86-64 into {dest}")
        try:
            manifest = collect(dest, args.python_version)
        except RuntimeError as exc:
            print(f"device_wheels: {exc}", file=sys.stderr)
            return 2
        print(f"  {len(manifest['wheels'])} wheels; on the machine already: "  # type: ignore[arg-type]
              + ", ".join(manifest["machine_requirements"]))  # type: ignore[arg-type]
    return 0 if size_report(dest, args.limit_mib) else 1


if __name__ == "__main__":
    sys.exit(main())
