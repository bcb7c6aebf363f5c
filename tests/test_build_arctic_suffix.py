"""scripts/build_arctic_suffix.py, offline: what it takes from ArcticInference's source archive (suffix decoding
only: no vLLM plugin, no torch) and that it refuses an archive whose hash is not the pinned one."""
import importlib.util
import io
import tarfile
import tomllib
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("build_arctic_suffix",
                                              Path(__file__).parent.parent / "scripts" / "build_arctic_suffix.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)


def archive(path: Path, names) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = f"# {name}\n".encode()
            info = tarfile.TarInfo(build.ROOT + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_source_tree_holds_suffix_decoding_only_and_registers_no_plugin(tmp_path):
    plugin = ["arctic_inference/vllm/plugin.py", "setup.py", "pyproject.toml", "csrc/custom_ops/ops.cu"]
    sdist = archive(tmp_path / build.SDIST, [*build.MEMBERS, *plugin])
    tree = build.source_tree(sdist, tmp_path / "src")
    files = {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()}
    assert files == {*build.MEMBERS, "pyproject.toml", "CMakeLists.txt"}
    assert (tree / "csrc/suffix_decoding/suffix_tree.cc").read_text() == "# csrc/suffix_decoding/suffix_tree.cc\n"
    project = tomllib.loads((tree / "pyproject.toml").read_text())
    assert "entry-points" not in project["project"] and project["project"]["version"] == build.WHEEL_VERSION
    requires = project["build-system"]["requires"] + project["project"]["dependencies"]
    assert not any(r.startswith(("torch", "vllm")) for r in requires), requires
    assert "arctic_inference/suffix_decoding" in (tree / "CMakeLists.txt").read_text()


def test_an_archive_that_is_not_the_pinned_one_is_refused_and_removed(tmp_path):
    sdist = archive(tmp_path / build.SDIST, build.MEMBERS)
    with pytest.raises(SystemExit, match="sha256"):
        build.fetch_sdist(tmp_path)
    assert not sdist.exists()
