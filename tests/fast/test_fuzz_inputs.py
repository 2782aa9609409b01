"""What users and the public type, fuzzed: run-config files (TOML, YAML, random bytes) must load as a validated
`Config` or fail with one `ConfigError`, never another exception; any body POSTed to the study app's /api/* routes
gets an answer below 500. Beside the random inputs, each known hostile one (deep nesting, a 5,000-digit integer, a
YAML alias bomb, a bidi or newline run name, invalid UTF-8, a count of a billion) has a deterministic test.

The property tests run a bounded number of examples (`max_examples`), each in milliseconds; under CI Hypothesis
draws the same examples every run."""
import json, logging, string, threading, time, tracemalloc

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st

from scope_nb.core.dialogue import free_port
from scope_nb.study.app import create_app
from scope_nb.study.store import ARMS, study_config
from scope_nb.train.config import Config, ConfigError, load_config
from scripted_endpoint import Scripted

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- the config loader: regressions

def _write(tmp_path, name, content):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def test_a_huge_eval_sample_count_is_refused_naming_the_key(tmp_path):
    p = _write(tmp_path, "c.toml", "[eval]\nsamples = 1000000000\n")
    with pytest.raises(ConfigError, match=r"eval\.samples"):
        load_config(p)


def _bomb(levels: int, width: int = 9) -> str:
    "A YAML document whose aliases expand to width**levels strings (the 'billion laughs')."
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\nenv:\n  options:\n    lol: *a{levels}\n"


def test_a_yaml_alias_bomb_is_refused_naming_the_file_quickly(tmp_path):
    small = _write(tmp_path, "small.yaml", _bomb(6))          # 531,441 strings once expanded
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(small)
    assert str(small) in str(e.value) and "alias" in str(e.value), e.value
    assert time.perf_counter() - t0 < 5
    big = _write(tmp_path, "big.yaml", _bomb(9))              # 387,420,489 strings: would never fit in memory
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="big.yaml"):
        load_config(big)
    assert time.perf_counter() - t0 < 5   # unbounded, the large one never ends
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="big.yaml"):
            load_config(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak                           # bytes allocated at the peak, the file's text included


@pytest.mark.parametrize("name", ["a\nb", "ab\u202ecod.exe", "x\u200by", "tab\there", " lead", "a/b"])
def test_a_run_name_with_control_or_bidi_characters_is_refused(tmp_path, name):
    with pytest.raises(ConfigError, match=r"run\.name") as e:
        load_config(_write(tmp_path, "c.toml", f"[run]\nname = {json.dumps(name)}\n"))
    assert str(e.value).isprintable(), e.value       # the name is shown escaped, never as the raw character


@pytest.mark.parametrize("suffix, content, offset", [
    (".toml", b'[run]\nname = "caf\xe9"\n', 17), (".yaml", b"run:\n  name: caf\xe9\n", 16)])
def test_a_config_file_that_is_not_utf8_is_refused_naming_the_file_and_the_byte(tmp_path, suffix, content, offset):
    p = _write(tmp_path, "c" + suffix, content)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value) and f"byte {offset}" in str(e.value), e.value


@pytest.mark.parametrize("text, suffix", [
    ("[run]\nseed = " + "9" * 5000 + "\n", ".toml"),            # past Python's int-conversion limit
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", ".toml"),          # past the recursion limit
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", ".yaml"),
    ("run:\n  seed: " + "9" * 5000 + "\n", ".yaml"),
    ("run: {name: [unclosed\n", ".yaml"),
    ("run:\n  when: 2024-01-01\n", ".yaml"),                    # a date: no config value is one
    ("[run]\nwhen = 2024-01-01\n", ".toml"),
    ("- just\n- a list\n", ".yaml"),
    ("a: &x [*x]\n", ".yaml"),                                  # an alias inside its own anchor
])
def test_malformed_config_files_are_one_config_error_naming_the_file(tmp_path, text, suffix):
    p = _write(tmp_path, "c" + suffix, text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(p) in str(e.value), e.value


# ---------------------------------------------------------------- the config loader: properties

SECTIONS = {name: list(getattr(info.annotation, "model_fields", {})) for name, info in Config.model_fields.items()}
KEYS = st.sampled_from(sorted({k for ks in SECTIONS.values() for k in ks} | set(SECTIONS))) | st.text(max_size=8)
SCALARS = (st.booleans() | st.integers() | st.integers(-10, 10) | st.floats() | st.text(max_size=20)
           | st.sampled_from(["tiny", "echo", "scripted:echo", "same", "api:gpt", "auto", "", ".."]))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(KEYS, c, max_size=4),
                      max_leaves=20)
RANDOM_TREES = st.dictionaries(st.sampled_from(list(SECTIONS)) | st.text(max_size=6),
                               st.dictionaries(KEYS, VALUES, max_size=5) | VALUES, max_size=4)
REAL_TREES = st.lists(st.sampled_from(list(SECTIONS)), unique=True, max_size=4).flatmap(  # real keys, random values
    lambda secs: st.fixed_dictionaries({s: st.dictionaries(st.sampled_from(SECTIONS[s]), VALUES, max_size=3)
                                        for s in secs}))
TREES = RANDOM_TREES | REAL_TREES


def _toml_key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False)


def _toml(v) -> str:
    "A value as TOML (inline tables and arrays); nulls become empty strings, TOML has none."
    if v is None: return '""'
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, float): return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(v), repr(v))
    if isinstance(v, int): return str(v)
    if isinstance(v, str): return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list): return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml(x)}" for k, x in v.items()) + "}"


def _loads_or_config_error(path):
    "load_config's only outcomes: a validated Config or a ConfigError (any other exception fails the test)."
    try:
        assert isinstance(load_config(path), Config)
    except ConfigError as e:
        assert str(e).strip()


def test_fuzz_config_trees_as_toml_and_yaml(tmp_path):
    @FUZZ
    @given(tree=TREES, fmt=st.sampled_from(["toml", "yaml"]))
    def check(tree, fmt):
        text = ("\n".join(f"{_toml_key(k)} = {_toml(v)}" for k, v in tree.items()) if fmt == "toml"
                else yaml.safe_dump(tree, allow_unicode=True))
        _loads_or_config_error(_write(tmp_path, "c." + fmt, text))
    check()


def test_fuzz_config_files_of_random_text_and_bytes(tmp_path):
    toml_like = st.lists(st.sampled_from(["[run]", "[eval]", "[[eval.panel]]", "name = ", "samples = ", "\n", "=",
                                          '"', "'''", "[", "]", "{", "}", "&a ", "*a ", "- ", ": ", "#", "9" * 5000,
                                          "1979-05-27", "\\u202e", "\x00", "\ud800"]) | st.text(max_size=5),
                         max_size=30).map("".join)
    @FUZZ
    @given(content=st.binary(max_size=400) | st.text(max_size=400) | toml_like, fmt=st.sampled_from(["toml", "yaml",
                                                                                                      "yml"]))
    def check(content, fmt):
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        _loads_or_config_error(_write(tmp_path, "c." + fmt, data))
    check()


# ---------------------------------------------------------------- the study app

@pytest.fixture()
def study(tmp_path, monkeypatch):
    "A p4g study app (a scripted agent) and one started session with its browser's cookie."
    monkeypatch.setenv("SCOPE_STUDY_SECRET", "s")
    monkeypatch.setenv("SCOPE_STUDY_ADMIN_TOKEN", "t")
    ep = Scripted()
    cfg = study_config({"study_id": "s1", "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "max_turns": 3,
                        "min_turns": 1, "start_limit": 100_000, "task_types": {"p4g": ["0", "1"]},
                        "arms": {a: {"base_url": ep.url, "model": a} for a in ARMS}})
    app = create_app(cfg)
    with TestClient(app, raise_server_exceptions=False) as c:
        sid = c.post("/api/start", json={"pid": "P1", "study": "s1", "session": "x"}).json()["session_id"]
        yield app, c, sid
    ep.server.shutdown()


def _api_routes(app) -> list[str]:
    return sorted(r.path for r in app.routes if r.path.startswith("/api/"))


DEEP = "[" * 15_000
HUGE_INT = '{"pid": ' + "9" * 5000 + ', "study": "s1", "session": "x"}'


def test_deeply_nested_bodies_are_a_400_on_every_route(study):
    app, c, sid = study
    assert len(_api_routes(app)) == 5
    for path in _api_routes(app):
        for body in (DEEP, '{"session_id": ' + "[" * 40 + "]" * 40 + "}", '{"a": ' * 2000 + "1" + "}" * 2000):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "nested" in r.json()["error"], (path, r.status_code, r.text)


def test_a_5000_digit_integer_is_a_400_on_every_route(study):
    app, c, sid = study
    for path in _api_routes(app):
        for body in (HUGE_INT, '{"session_id": "%s", "text": %s}' % (sid, "1" * 5000), '{"x": 1e999}',
                     '{"x": NaN}', '{"x": -Infinity}'):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "JSON" in r.json()["error"], (path, body[:20], r.status_code, r.text)


def test_a_refused_body_is_at_most_one_log_line_under_uvicorn(study, caplog):
    "Under a real uvicorn server at the log level `serve` uses, an unparseable body is one log line, no traceback."
    import uvicorn
    app, _, _ = study
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", log_config=None))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        for _ in range(600):
            if server.started: break
            time.sleep(0.05)
        with caplog.at_level(logging.WARNING):
            for body in (HUGE_INT, DEEP):
                caplog.clear()
                r = httpx.post(f"http://127.0.0.1:{port}/api/start", content=body,
                               headers={"Content-Type": "application/json"}, timeout=30)
                assert r.status_code == 400, r.text
                lines = caplog.text.strip().splitlines()
                assert len(lines) == 1 and "refused (400)" in lines[0], caplog.text   # one line, no traceback
    finally:
        server.should_exit = True
        th.join(30)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=25)
CONTENT_TYPES = st.just("application/json") | st.sampled_from([  # JSON half the time, so most bodies reach the parser
    "application/json; charset=utf-8", "APPLICATION/JSON", "", "text/plain", "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x"])


def _bodies(sid: str):
    "Random bytes, random JSON, objects with the routes' keys (this browser's session among them), deep and huge."
    known = st.fixed_dictionaries({}, optional={
        "session_id": st.sampled_from([sid, "x", ""]) | JSON_VALUES, "text": st.text(max_size=50) | JSON_VALUES,
        "answers": st.dictionaries(st.sampled_from(["overall", "donation", "comment", "x"]), JSON_VALUES) | JSON_VALUES,
        "pid": st.text(string.ascii_letters, min_size=1, max_size=8) | JSON_VALUES,
        "study": st.sampled_from(["s1", "s2"]) | JSON_VALUES, "session": st.just("x") | JSON_VALUES})
    deep = st.builds(lambda n, o, c: (o * n + "1" + c * n).encode(), st.integers(1, 16_000),
                     st.sampled_from(["[", '{"a": ']), st.sampled_from(["]", "}", ""]))
    huge = st.integers(4000, 15_000).map(lambda n: ('{"pid": %s}' % ("7" * n)).encode())
    return (st.binary(max_size=300) | deep | huge
            | (JSON_VALUES | known).map(lambda v: json.dumps(v).encode()))


def test_fuzz_every_api_route_answers_below_500(study):
    app, c, sid = study
    @FUZZ
    @given(path=st.sampled_from(_api_routes(app)), body=_bodies(sid), ctype=CONTENT_TYPES)
    def check(path, body, ctype):
        r = c.post(path, content=body, headers={"Content-Type": ctype} if ctype else {})
        assert r.status_code < 500, (path, body[:80], ctype, r.status_code, r.text[:300])
    check()


@pytest.mark.parametrize("body", [b'study_id = "x\xff"\n', b"a = " + b"9" * 5000 + b"\n", b"a = " + b"[" * 5000])
def test_a_bad_study_config_is_one_config_error_naming_the_file(tmp_path, body):
    "The study server's config: bytes that are not UTF-8, a 5,000-digit integer, deep nesting; each names the file."
    from scope_nb.study.store import load_study_config

    p = tmp_path / "study.toml"
    p.write_bytes(body)
    with pytest.raises(ConfigError, match=str(p).replace(".", r"\.")):
        load_study_config(p)
