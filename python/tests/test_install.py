"""The wheel as a user installs it: the command on PATH, `python -m clarion`, the version."""

import os
import pathlib
import shutil
import subprocess
import sys

import clarion


def test_package_is_the_installed_wheel_not_the_source_tree():
    site = pathlib.Path(clarion.__file__).resolve()
    assert "site-packages" in site.parts, site
    assert (site.parent / "py.typed").is_file()


def test_clarion_command_is_on_path_and_is_the_binary():
    exe = shutil.which("clarion")
    assert exe is not None
    assert pathlib.Path(exe).parent == pathlib.Path(sys.executable).parent
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30, check=True)
    assert "serve" in out.stdout and "publish" in out.stdout
    # The packaged binary is stripped: an ELF without a symbol table section.
    assert b".symtab" not in pathlib.Path(exe).read_bytes()


def test_python_dash_m_runs_the_same_binary():
    out = subprocess.run(
        [sys.executable, "-m", "clarion", "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == f"clarion {clarion.__version__}"


def test_version_is_the_workspace_version():
    expected = os.environ.get("CLARION_EXPECTED_VERSION")
    assert expected, "packaging/test.sh sets CLARION_EXPECTED_VERSION from Cargo.toml"
    assert clarion.__version__ == expected


def test_binary_path_override(tmp_path):
    fake = tmp_path / "clarion"
    fake.write_text("#!/bin/sh\necho overridden \"$@\"\n")
    fake.chmod(0o755)
    env = dict(os.environ, CLARION_BINARY_PATH=str(fake))
    out = subprocess.run([sys.executable, "-m", "clarion", "x"], capture_output=True, text=True, timeout=30, env=env)
    assert out.stdout.strip() == "overridden x"
    env["CLARION_BINARY_PATH"] = str(tmp_path / "missing")
    out = subprocess.run([sys.executable, "-m", "clarion"], capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode != 0 and "CLARION_BINARY_PATH" in out.stderr
