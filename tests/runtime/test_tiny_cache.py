"""grpojob.tiny_cache: the tiny models `grpojob run` builds are built once per user and copied after."""
import hashlib
import threading
import time
from pathlib import Path

from grpojob import tiny_cache
from grpojob.tiny import build

calls: list[Path] = []


def counted(output, **kw):
    calls.append(Path(output))
    return build(output, **kw)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_second_build_is_a_copy_of_the_first_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setenv(tiny_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    calls.clear()
    first, hit1 = tiny_cache.build(counted, tmp_path / "a" / "model", tools=True)
    second, hit2 = tiny_cache.build(counted, tmp_path / "b" / "model", tools=True)
    assert (hit1, hit2) == (False, True) and len(calls) == 1
    assert calls[0].parent == tmp_path / "cache" / "tiny-models"  # built beside its entry, then renamed
    assert digest(first) == digest(second) and "model.safetensors" in digest(second)
    # the same builder with other arguments is another model
    other, hit3 = tiny_cache.build(counted, tmp_path / "c" / "model", tools=False)
    assert not hit3 and len(calls) == 2 and digest(other) != digest(first)
    entries = [p for p in (tmp_path / "cache" / "tiny-models").iterdir() if p.is_dir()]
    assert len(entries) == 2  # no staging folder left


def slow(output, **kw):
    calls.append(Path(output))
    time.sleep(0.5)  # long enough for the other builder to arrive while this one builds
    return build(output, **kw)


def test_two_builders_of_one_model_at_once_build_it_once(tmp_path, monkeypatch):
    """Two test workers (or runs) wanting the same model: the second waits and copies."""
    monkeypatch.setenv(tiny_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    calls.clear()
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: tiny_cache.build(slow, tmp_path / str(i))}))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(hit for _, hit in results.values()) == [False, True]
    assert digest(tmp_path / "0") == digest(tmp_path / "1")


def test_the_key_changes_with_the_builders_source_and_arguments():
    assert tiny_cache.key(build, tools=True) == tiny_cache.key(build, tools=True)
    assert tiny_cache.key(build, tools=True) != tiny_cache.key(build, tools=False)
    assert tiny_cache.key(build) != tiny_cache.key(counted)  # another builder (another module's source)


def test_an_unwritable_cache_builds_in_place(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache's folder would be")
    monkeypatch.setenv(tiny_cache.ENV_CACHE_DIR, str(blocked / "cache"))
    out, hit = tiny_cache.build(build, tmp_path / "model")
    assert not hit and (out / "config.json").exists()
    assert "not writable" in capsys.readouterr().err


def test_off_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv(tiny_cache.ENV_CACHE_DIR, "off")
    assert tiny_cache.cache_dir() is None
    out, hit = tiny_cache.build(build, tmp_path / "model")
    assert not hit and (out / "config.json").exists()
