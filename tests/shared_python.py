"""A CPython of a shared build, made from the host's own: a main() that calls
Py_BytesMain, linked to libpython3.X.so with /usr/bin/python3-config
--embed (python3-dev, which tools/setup.sh installs). Its executable has no
_PyRuntime; the runtime lives in the library, as in pyenv's, Fedora's and
RHEL's pythons."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

CONFIG = "/usr/bin/python3-config"
MAIN = "#include <Python.h>\nint main(int argc, char **argv) { return Py_BytesMain(argc, argv); }\n"


def build_shared_python(directory: Path, name: str = "pyshared") -> Path | None:
    """The program's path, or None without gcc or python3-config."""
    gcc = shutil.which("gcc")
    if gcc is None or not Path(CONFIG).exists():
        return None
    flags = subprocess.run(
        [CONFIG, "--includes", "--ldflags", "--embed"], capture_output=True, text=True, check=True
    ).stdout
    src = directory / f"{name}.c"
    out = directory / name
    src.write_text(MAIN)
    subprocess.run([gcc, "-O2", str(src), "-o", str(out), *shlex.split(flags)], check=True)
    out.chmod(0o755)
    return out
