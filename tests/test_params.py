"""A tunable's range is declared once (runtime/params.py), and every front end refuses what it
refuses: the CLI with one line naming the flag and exit code 2, the server with a 400 naming the
JSON parameter. The values sent are derived from the declaration, so a bound moved there moves
the test with it."""

from __future__ import annotations

import pytest

from laguna_dflash.runtime.cli import main
from laguna_dflash.runtime.errors import RequestError
from laguna_dflash.runtime.params import GROUPS, MAX_SIZE, MAX_TOKENS, PAIR, REQUEST, RPC_SERVER, SAMPLING, SERVER, Param

#: a model path that does not exist: an error about a flag proves the flag was checked first
NO_MODEL = ["-m", "/nonexistent/target.gguf"]
#: what both the CLI's run and the server's requests take (the server's budget: at least one token)
SHARED = [*SAMPLING, REQUEST["n_predict"], REQUEST["n_max"]]
SERVED = [*SAMPLING, MAX_TOKENS, REQUEST["n_max"]]


def cases(params) -> list:
    return [pytest.param(p, v, id=f"{p.field}={v}") for p in params for v in p.out_of_range()]


def error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_every_bounded_param_yields_values_to_refuse():
    bounded = [p for g in GROUPS for p in g if p.lo is not None or p.hi is not None]
    assert {"temperature", "top_p", "n_max", "n_predict", "ctx_size", "port", "parallel"} <= {p.field for p in bounded}
    for p in bounded:
        for v in p.out_of_range():
            with pytest.raises(RequestError) as e:
                p.check(v)
            assert e.value.field == p.field and e.value.expected == p.expected(found=v)


def test_the_range_text_follows_the_bounds():
    assert Param("x", ("--x",), "h", float, lo=0, hi=1, above=True, note="(1: off)").expected() == \
        "a number in (0, 1] (1: off)"
    assert Param("x", ("--x",), "h", int, lo=1, hi=MAX_SIZE).expected(found=0) == "an integer >= 1"
    assert Param("x", ("--x",), "h", int, lo=0, also=(-1, "random")).out_of_range() == [-2]
    assert REQUEST["n_max"].check("auto") == "auto" and REQUEST["n_max"].check(" 3") == 3
    assert PAIR["threads"].flag == "-t/--threads" and SAMPLING["seed"].flag == "--seed"
    assert REQUEST["n_predict"].param == "max_tokens" and SAMPLING["top_p"].param == "top_p"


@pytest.mark.parametrize("param,value", cases(SHARED))
def test_run_refuses_what_the_declaration_refuses(capsys, param, value):
    assert main([*NO_MODEL, "-p", "x", param.flags[0], str(value)]) == 2
    assert error_line(capsys).startswith(f"error: {param.flag}: expected {param.expected(found=value)}")


@pytest.mark.parametrize("param,value", cases(PAIR))
def test_the_pair_flags_refuse_what_the_declaration_refuses(capsys, param, value):
    for command in ([], ["bench", "-md", "/nonexistent/d.gguf"], ["serve"]):
        assert main([*command, *NO_MODEL, param.flags[0], str(value)]) == 2
        assert error_line(capsys).startswith(f"error: {param.flag}: expected "), command


@pytest.mark.parametrize("param,value", cases(SERVER))
def test_serve_refuses_what_the_declaration_refuses(capsys, param, value):
    pytest.importorskip("fastapi")
    assert main(["serve", *NO_MODEL, param.flags[0], str(value)]) == 2
    assert error_line(capsys).startswith(f"error: {param.flag}: expected {param.expected(found=value)}")


@pytest.fixture(scope="module")
def srv(models):
    pytest.importorskip("fastapi")
    from server_harness import LiveServer, make_pool

    target, path, drafter = models
    with LiveServer(make_pool(target, path, drafter, parallel=1, max_queue=4)) as s:
        yield s


def test_the_server_refuses_what_the_declaration_refuses(srv):
    """One server for every case (a module fixture per parameter would reload the pair)."""
    import httpx

    sent = 0
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        for param in SERVED:
            for value in param.out_of_range():
                r = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, param.param: value})
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == param.param, (param.field, value, err)
                assert err["message"].startswith(f"{param.param}: expected {param.expected(found=value)}"), err
                sent += 1
    assert sent >= len(SERVED)


@pytest.mark.parametrize("param,value", cases(RPC_SERVER))
def test_laguna_rpc_server_refuses_what_the_declaration_refuses(capsys, param, value):
    from laguna_dflash.runtime.rpc_server import main as rpc_server_main

    assert rpc_server_main([param.flags[0], str(value)]) == 2
    assert error_line(capsys).startswith(f"error: {param.flag}: expected {param.expected(found=value)}")
