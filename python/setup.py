"""Builds the `conveyor` package: the .py files plus libconveyor_c.so.1 and libconveyor_video.so.1
(conveyor.video's DeviceFrames, loaded only when used) in conveyor/lib/.

Each library is taken from its variable ($CONVEYOR_LIBRARY, $CONVEYOR_VIDEO_LIBRARY), else for
the video library from beside $CONVEYOR_LIBRARY, else from a CMake build tree of this repository
($CONVEYOR_BUILD_DIR, else ../build), else built there with CMake (its target only). The version
is the top-level CMakeLists.txt's project(VERSION), the one place it is written.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
# The repository: this file's parent, or $CONVEYOR_SOURCE_DIR for a copy built elsewhere
# (tools/wheel.sh).
ROOT = Path(os.environ.get("CONVEYOR_SOURCE_DIR", HERE.parent)).resolve()
# soname -> (its CMake target, the variable naming a built copy)
LIBRARIES = {"libconveyor_c.so.1": ("conveyor_c", "CONVEYOR_LIBRARY"),
             "libconveyor_video.so.1": ("conveyor_video", "CONVEYOR_VIDEO_LIBRARY")}


def version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(conveyor VERSION ([0-9.]+)", text)
    if not m:
        raise RuntimeError(f"no project(conveyor VERSION ...) in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


def find_library(soname):
    target, variable = LIBRARIES[soname]
    env = os.environ.get(variable)
    if env:
        if not Path(env).is_file():
            raise RuntimeError(f"{variable}={env}: no such file")
        return Path(env)
    client = os.environ.get("CONVEYOR_LIBRARY")
    if client and (Path(client).resolve().parent / soname).is_file():
        return (Path(client).resolve().parent / soname).resolve()
    build = Path(os.environ.get("CONVEYOR_BUILD_DIR", ROOT / "build"))
    lib = build / "python" / "conveyor" / "lib" / soname
    if not lib.exists():
        print(f"conveyor: building {soname} with CMake in {build}", flush=True)
        if not (build / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                                   "-DCONVEYOR_BUILD_TESTS=OFF", "-DCONVEYOR_BUILD_BENCH=OFF"])
        subprocess.check_call(["cmake", "--build", str(build), "--target", target])
    return lib.resolve()


class BuildPy(build_py):
    def run(self):
        super().run()
        out = Path(self.build_lib) / "conveyor" / "lib"
        out.mkdir(parents=True, exist_ok=True)
        for soname in LIBRARIES:
            shutil.copyfile(find_library(soname), out / soname)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a native library inside: a platform wheel, not a pure one
        return True


cmdclass = {"build_py": BuildPy}
try:
    from wheel.bdist_wheel import bdist_wheel

    class BdistWheel(bdist_wheel):
        """py3-none-<platform>: nothing is compiled against an interpreter or its ABI."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:  # pragma: no cover - wheel not installed: pip install still works
    pass

setup(version=version(), cmdclass=cmdclass, distclass=BinaryDistribution,
      package_data={"conveyor": ["lib/*.so*", "py.typed"]})
