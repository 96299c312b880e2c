"""What a result says about the machine it ran on: the driver's version comes from the kernel module's own line."""

import pytest

from runners.harness.result import driver_version, system_info


@pytest.mark.parametrize(("line", "version"), [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Mar 10 11:12:13 UTC 2026\n", "580.159.04"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)\n",
     "570.86.15"),
    ("something else entirely\n", ""),
])
def test_the_driver_version_is_read_from_the_kernel_modules_line(tmp_path, line, version):
    path = tmp_path / "version"
    path.write_text(line + "GCC version:  gcc version 12.2.0\n")
    assert driver_version(str(path)) == version


def test_no_driver_is_an_empty_version_not_an_error(tmp_path):
    assert driver_version(str(tmp_path / "absent")) == ""
    assert "driver" in system_info({"backend": "test"})
