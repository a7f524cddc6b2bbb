"""Capture client against a tiny loopback HTTP server that replays recorded answers.

This tests the client (concurrency bound, retries, bundle round trip, teacher-forced
requests), not vLLM: the real-server test comes with the launcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _verify_support import MTP, NOMTP, require_fixtures, run_cli

from bakery.errors import UsageError
from bakery.verify import CaptureSettings, ServerInfo, capture_bundle, compare_bundles, load_suite
from bakery.verify.bundle import BundleMeta, load_bundle
from bakery.verify.errors import CaptureError

FAST = {"backoff_s": 0.0, "timeout_s": 30.0, "progress": False}


class FakeVllm:
    """Answers like vLLM: recorded fixture responses by prompt, else a synthetic model."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        drop_first: int = 0,
        status: int = 200,
        shift: float = 0.0,
        spec_lag: float | None = None,
    ) -> None:
        self.delay, self.drop_left, self.status, self.shift = delay, drop_first, status, shift
        # With drafts: /metrics counts each answer's drafted and accepted tokens, spec_lag
        # seconds after the answer leaves (None: no /metrics, as a server without it).
        self.spec_lag, self.spec = spec_lag, {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = self.completion_calls = 0
        self.tokenize_calls = 0
        self.recorded: dict[str, dict[str, Any]] = {}

    def record(self, bundle: Path) -> None:
        for path in sorted(bundle.glob("completion_*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            self.recorded[doc["request"]["prompt"]] = doc

    @staticmethod
    def ids(text: str) -> list[int]:
        return [sum(map(ord, word)) % 1000 for word in text.split()]

    def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.tokenize_calls += 1
        text = body["prompt"]
        if text in self.recorded:
            return self.recorded[text]["tokenize_response"]
        tokens = self.ids(text)
        return {"count": len(tokens), "tokens": tokens, "token_strs": None}

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):  # a batch
            answers = [self.complete({**body, "prompt": one}) for one in prompt]
            choices = [{**a["choices"][0], "index": i} for i, a in enumerate(answers)]
            return {**answers[0], "choices": choices[::-1]}  # any order: index says which
        if isinstance(prompt, str) and prompt in self.recorded:
            return self.recorded[prompt]["response"]
        ids = prompt if isinstance(prompt, list) else self.ids(prompt)
        if "prompt_logprobs" in body:
            return self.score(ids)
        out = [(sum(ids) + 7 * i) % 50 for i in range(body["max_tokens"])]
        if self.spec_lag is not None:
            drafted = {"drafts": len(out), "draft_tokens": len(out), "accepted": sum(ids) % 3}
            threading.Timer(self.spec_lag, self.count, [drafted]).start()
        logprobs = {
            "tokens": [f"token_id:{t}" for t in out],
            "token_logprobs": [-0.1 - self.shift for _ in out],
            "top_logprobs": [
                {f"token_id:{t}": -0.1 - self.shift, f"token_id:{t + 1}": -3.0} for t in out
            ],
            "text_offset": list(range(len(out))),
        }
        return self.wrap({"text": "", "logprobs": logprobs, "prompt_token_ids": ids})

    def score(self, ids: list[int]) -> dict[str, Any]:
        positions: list[Any] = [None] + [
            {
                str(t): {"logprob": -0.2 - self.shift, "rank": 1},
                str(t + 1): {"logprob": -2.0 + self.shift, "rank": 2},
            }
            for t in ids[1:]
        ]
        return self.wrap({"text": "", "logprobs": None, "prompt_logprobs": positions})

    @staticmethod
    def wrap(choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": "fake",
            "system_fingerprint": "fake-fp",
            "choices": [{"index": 0, **choice}],
        }

    def count(self, drafted: dict[str, int]) -> None:
        with self.lock:
            for key, value in drafted.items():
                self.spec[key] += value

    def metrics(self) -> str:
        """vLLM's counter families, as its /metrics writes them (HELP lines left out)."""
        names = {"drafts": "num_drafts", "draft_tokens": "num_draft_tokens",
                 "accepted": "num_accepted_tokens"}  # fmt: skip
        with self.lock:
            return "".join(
                f"# TYPE vllm:spec_decode_{name}_total counter\n"
                f'vllm:spec_decode_{name}_total{{engine="0"}} {self.spec[key]}.0\n'
                for key, name in names.items()
            )

    def enter(self) -> bool:
        """Count a completion request; False means: drop this connection unanswered."""
        with self.lock:
            self.completion_calls += 1
            if self.drop_left > 0:
                self.drop_left -= 1
                return False
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return True

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def handler_for(fake: FakeVllm) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def send(self, status: int, data: Any) -> None:
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self.send(200, {"data": [{"id": "deepseek-ai/DeepSeek-V4-Flash"}]})
            elif self.path == "/version":
                self.send(200, {"version": "0.20.1rc1.dev144+g5737770c6"})
            elif self.path == "/metrics" and fake.spec_lag is not None:
                payload = fake.metrics().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            else:
                self.send(404, {"error": self.path})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/tokenize":
                self.send(200, fake.tokenize(body))
                return
            if not fake.enter():
                self.close_connection = True  # no response at all: a dropped connection
                return
            try:
                time.sleep(fake.delay)
                if fake.status != 200:
                    self.send(fake.status, {"error": "boom"})
                else:
                    self.send(200, fake.complete(body))
            finally:
                fake.leave()

    return Handler


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


def serve(fake: FakeVllm) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def fixture_server() -> Iterator[tuple[FakeVllm, str]]:
    require_fixtures()
    fake = FakeVllm(delay=0.2)
    fake.record(NOMTP)
    yield from ((fake, url) for url in serve(fake))


def fixture_suite(tmp_path: Path) -> Path:
    """The fixtures' own questions as a suite, so case names line up with the fixtures."""
    lines = []
    for path in sorted(NOMTP.glob("completion_*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        lines.append(
            json.dumps(
                {
                    "case": doc["name"].removeprefix("completion_"),
                    "prompt": doc["request"]["prompt"],
                    "max_tokens": doc["request"]["max_tokens"],
                }
            )
        )
    suite = tmp_path / "fixtures.jsonl"
    suite.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return suite


def test_round_trip_reproduces_the_fixture_bundle(fixture_server, tmp_path: Path) -> None:
    fake, url = fixture_server
    out = tmp_path / "captured"
    settings = CaptureSettings(concurrency=2, token_ids=False, **FAST)
    capture_bundle(
        url,
        out,
        load_suite(str(fixture_suite(tmp_path))),
        settings=settings,
        server=ServerInfo(command="vllm serve x", env={"DSV41_DCP_STAGE": "9", "OTHER": "1"}),
    )
    same = compare_bundles(NOMTP, out)
    assert same.passed is True
    for case in same.cases.values():
        assert case.tokens_match is True and case.prompt_token_ids_match is True
        assert case.max_common_logprob_abs_error == 0.0
    # Key order survived the round trip: the captured bundle scores exactly like the original.
    assert compare_bundles(out, MTP).cases == compare_bundles(NOMTP, MTP).cases
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["vllm_version"] == "0.20.1rc1.dev144+g5737770c6"
    assert meta["system_fingerprints"] == ["vllm-0.20.1rc1.dev144+g5737770c6-tp2-428f9306"]
    assert meta["dsv41_gates"] == {"DSV41_DCP_STAGE": "9"}
    assert meta["server_command"] == "vllm serve x"
    assert meta["model"] == "deepseek-ai/DeepSeek-V4-Flash"
    typed = msgspec.convert(meta, BundleMeta, strict=True)  # written from its type, whole
    assert typed.vllm_version_note is msgspec.UNSET and typed.settings.token_keys == "strings"


def test_concurrency_is_bounded(fixture_server, tmp_path: Path) -> None:
    fake, url = fixture_server
    settings = CaptureSettings(concurrency=2, token_ids=False, **FAST)
    capture_bundle(url, tmp_path / "b", load_suite(str(fixture_suite(tmp_path))), settings=settings)
    assert fake.completion_calls == 5
    assert fake.max_in_flight == 2  # 5 cases, 0.2 s each: the bound is reached, never passed


def synthetic(tmp_path: Path, extra: str = "") -> Path:
    suite = tmp_path / "syn.jsonl"
    suite.write_text(
        '{"case": "alpha", "prompt": "one two three", "max_tokens": 4}\n'
        '{"case": "beta", "prompt": "four five", "max_tokens": 3}\n' + extra,
        encoding="utf-8",
    )
    return suite


def run_server(fake: FakeVllm) -> tuple[Iterator[str], str]:
    gen = serve(fake)
    return gen, next(gen)


def test_connection_errors_are_retried(tmp_path: Path) -> None:
    fake = FakeVllm(drop_first=2)
    gen, url = run_server(fake)
    try:
        capture_bundle(
            url,
            tmp_path / "b",
            load_suite(str(synthetic(tmp_path))),
            settings=CaptureSettings(concurrency=1, retries=3, **FAST),
        )
    finally:
        gen.close()
    assert fake.completion_calls == 2 + 2  # two dropped, then one per case
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "bundle.json",
        "completion_alpha.json",
        "completion_beta.json",
    ]


def _spec_capture(tmp_path: Path, fake: FakeVllm, concurrency: int) -> dict[str, Any]:
    tmp_path.mkdir(exist_ok=True)
    gen, url = run_server(fake)
    try:
        suite = load_suite(str(synthetic(tmp_path)))
        settings = CaptureSettings(concurrency=concurrency, **FAST)
        capture_bundle(url, tmp_path / "b", suite, settings=settings)
    finally:
        gen.close()
    return json.loads((tmp_path / "b" / "bundle.json").read_text())


def test_each_case_gets_the_spec_decode_counts_of_its_own_request(tmp_path: Path) -> None:
    """One request in flight: a case's counts are the /metrics difference around it, read
    once the counters stop moving (they land 0.1 s after the answer here). Read at once,
    alpha would get none and beta alpha's."""
    fake = FakeVllm(spec_lag=0.1)
    meta = _spec_capture(tmp_path, fake, concurrency=1)
    suite = load_suite(str(synthetic(tmp_path)))
    expected = {}
    for case in suite.cases:
        ids = FakeVllm.ids(case.prompt)
        counts = {"drafts": case.max_tokens, "draft_tokens": case.max_tokens}
        expected[case.case] = {
            "records": [f"completion_{case.case}"],
            "counts": {**counts, "accepted": sum(ids) % 3},
        }
    assert meta["spec_decode"] == expected
    assert {c["counts"]["accepted"] for c in expected.values()} != {0}  # the sums can differ
    assert fake.spec["drafts"] == sum(c.max_tokens for c in suite.cases)


def test_no_spec_decode_counts_with_several_requests_in_flight_or_no_metrics(tmp_path):
    assert "spec_decode" not in _spec_capture(tmp_path / "a", FakeVllm(spec_lag=0.0), 2)
    assert "spec_decode" not in _spec_capture(tmp_path / "b", FakeVllm(), 1)  # /metrics 404


def test_retries_give_up_with_a_capture_error(tmp_path: Path) -> None:
    fake = FakeVllm(drop_first=10)
    gen, url = run_server(fake)
    try:
        with pytest.raises(CaptureError, match="unreachable after 2 attempts") as info:
            capture_bundle(
                url,
                tmp_path / "b",
                load_suite(str(synthetic(tmp_path))),
                settings=CaptureSettings(concurrency=1, retries=1, **FAST),
            )
    finally:
        gen.close()
    assert info.value.exit_code == 1
    assert not (tmp_path / "b").exists()  # a failed capture leaves no half bundle
    assert list(tmp_path.iterdir()) == [tmp_path / "syn.jsonl"]


def test_http_error_is_a_capture_error(tmp_path: Path) -> None:
    gen, url = run_server(FakeVllm(status=500))
    try:
        with pytest.raises(CaptureError, match="HTTP 500"):
            capture_bundle(
                url,
                tmp_path / "b",
                load_suite(str(synthetic(tmp_path))),
                settings=CaptureSettings(**FAST),
            )
    finally:
        gen.close()


def test_exact_context_length_prompts(tmp_path: Path) -> None:
    fake = FakeVllm()
    gen, url = run_server(fake)
    edge = '{"case": "ctx_0007", "prompt_tokens": 7, "filler": "a b c", "max_tokens": 2}\n'
    try:
        capture_bundle(
            url,
            tmp_path / "b",
            load_suite(str(synthetic(tmp_path, edge))),
            settings=CaptureSettings(**FAST),
        )
    finally:
        gen.close()
    doc = json.loads((tmp_path / "b" / "completion_ctx_0007.json").read_text())
    assert len(doc["request"]["prompt"]) == 7
    assert doc["request"]["return_tokens_as_token_ids"] is True
    assert fake.tokenize_calls == 2 + 2  # two text cases, then filler + repeated filler


def test_refuses_a_non_empty_output_directory(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("")
    with pytest.raises(UsageError, match="is not empty"):
        capture_bundle("http://127.0.0.1:9", tmp_path / "b", load_suite(str(synthetic(tmp_path))))


def capture_teacher(tmp_path: Path, name: str, shift: float, reference: Path | None) -> Path:
    gen, url = run_server(FakeVllm(shift=shift))
    try:
        return capture_bundle(
            url,
            tmp_path / name,
            load_suite(str(synthetic(tmp_path))),
            settings=CaptureSettings(**FAST),
            teacher_forced=True,
            reference=reference,
        )
    finally:
        gen.close()


def test_teacher_forced_capture_and_compare(tmp_path: Path) -> None:
    base = capture_teacher(tmp_path, "base", 0.0, None)
    same = capture_teacher(tmp_path, "same", 0.0, base)
    shifted = capture_teacher(tmp_path, "shifted", 0.3, base)
    teacher = json.loads((shifted / "teacher_alpha.json").read_text())
    assert teacher["case"] == "completion_alpha" and teacher["completion_start"] == 3
    assert teacher["request"]["prompt_logprobs"] == 20 and teacher["request"]["echo"] is True

    report = compare_bundles(base, same, teacher_forced=True)
    assert report.cases["completion_alpha"].tf_max_kl == 0.0
    report = compare_bundles(base, shifted, teacher_forced=True)
    alpha = report.cases["completion_alpha"]
    assert alpha.tf_positions == 7  # 3 prompt + 4 generated
    assert alpha.tf_max_abs_logprob_delta == pytest.approx(0.3)
    assert alpha.tf_max_kl > 0.0

    code, out = run_cli(
        ["compare", str(base), str(shifted), "--teacher-forced", "--max-tf-kl", "1e-6"]
    )
    assert code == 1 and "parity failed" in out
    args = ["compare", str(base), str(same), "--teacher-forced", "--max-tf-kl", "1e-6"]
    assert run_cli(args)[0] == 0


@pytest.mark.parametrize(
    "flag, gate",
    [
        ("--max-tf-logprob-delta", "max_tf_abs_logprob_delta"),
        ("--max-tf-mean-logprob-delta", "max_tf_mean_abs_logprob_delta"),
    ],
)
def test_teacher_forced_logprob_delta_gates(tmp_path: Path, flag: str, gate: str) -> None:
    """Every scored position moved by 0.3: off by default it passes, a 0.2 bound fails it
    (the report says the bound came from the command line), a 0.4 bound passes it."""
    base = capture_teacher(tmp_path, "base", 0.0, None)
    shifted = capture_teacher(tmp_path, "shifted", 0.3, base)
    report = tmp_path / "r.json"
    args = ["compare", str(base), str(shifted), "--teacher-forced", "--json", str(report)]
    assert run_cli(args)[0] == 0
    code, out = run_cli([*args, flag, "0.2"])
    assert code == 1 and "parity failed for 2 of 2 cases" in out, out
    doc = json.loads(report.read_text())
    assert doc["gates"][gate] == {"source": "cli", "value": 0.2}
    assert any(gate in failure for failure in doc["cases"]["completion_alpha"]["gate_failures"])
    assert run_cli([*args, flag, "0.4"])[0] == 0


def test_a_killed_captures_staging_is_swept_by_the_next(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    left = tmp_path / f".bundle.tmp-{dead}"
    left.mkdir()
    (left / "case.json").write_bytes(b"x" * 1000)
    code, _ = run_cli(["capture", "--url", "http://127.0.0.1:9", "--retries", "0",
                       "--out", str(tmp_path / "bundle")])  # fmt: skip
    assert code != 0  # nothing listens there
    assert not left.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]


BATCH = (
    '{"case": "batch", "batch_prompt_tokens": [5, 2, 9], "filler": "a b c d", "max_tokens": 3}\n'
)


def test_a_batch_is_one_request_and_a_record_per_prompt(tmp_path: Path) -> None:
    """The prompts go out together in one request; each comes back as its own record,
    the one a single request of that prompt gives (the fake model answers per prompt),
    with its place in the batch; compare then reads them prompt by prompt."""
    fake = FakeVllm()
    gen, url = run_server(fake)
    try:
        suite = load_suite(str(synthetic(tmp_path, BATCH)))
        capture_bundle(url, tmp_path / "b", suite, settings=CaptureSettings(**FAST))
    finally:
        gen.close()
    assert fake.completion_calls == 2 + 1  # alpha, beta, and one for the whole batch
    names = sorted(p.stem for p in (tmp_path / "b").glob("completion_batch_*.json"))
    assert names == ["completion_batch_00", "completion_batch_01", "completion_batch_02"]
    filler_ids = FakeVllm.ids(" ".join(["a b c d"] * 100))  # the fake tokenizes per word
    for i, length in enumerate((5, 2, 9)):
        doc = json.loads((tmp_path / "b" / f"completion_batch_{i:02d}.json").read_text())
        assert doc["batch"] == {"case": "batch", "index": i, "size": 3}
        assert doc["request"]["prompt"] == filler_ids[7 * i : 7 * i + length]
        alone = fake.complete({**doc["request"], "prompt": doc["request"]["prompt"]})
        assert doc["response"]["choices"] == [{**alone["choices"][0], "index": i}]
    bundle = load_bundle(tmp_path / "b")
    assert len(bundle.cases) == 2 + 3


def test_a_batch_answer_missing_a_prompt_is_a_capture_error(tmp_path: Path, monkeypatch) -> None:
    fake = FakeVllm()
    real = fake.complete

    def drop_one(body: dict[str, Any]) -> dict[str, Any]:
        answer = real(body)
        if not isinstance(body["prompt"][0], list):
            return answer
        return {**answer, "choices": answer["choices"][:-1]}  # the batch lost one

    monkeypatch.setattr(fake, "complete", drop_one)
    gen, url = run_server(fake)
    try:
        suite = load_suite(str(synthetic(tmp_path, BATCH)))
        with pytest.raises(CaptureError, match="batch of 3 prompts came back with choices"):
            capture_bundle(url, tmp_path / "b", suite, settings=CaptureSettings(**FAST))
    finally:
        gen.close()
    assert not (tmp_path / "b").exists()  # no half bundle


# ---- the command line's own flags, end to end --------------------------------------------


def cli_capture(fake: FakeVllm, out: Path, suite: Path, *flags: str) -> tuple[int, str]:
    """``bakery verify capture`` of ``suite`` from ``fake`` into ``out``: (exit code, output)."""
    gen, url = run_server(fake)
    try:
        return run_cli(["capture", "--url", url, "--out", str(out), "--suite", str(suite),
                        "--retries", "0", *flags])  # fmt: skip
    finally:
        gen.close()


def test_capture_flags_reach_the_server_and_the_bundle(tmp_path: Path) -> None:
    """--concurrency bounds the requests in flight, --token-keys strings asks for token
    strings, --server-cmd is recorded; the bundle then compares like the fixture."""
    require_fixtures()
    fake = FakeVllm(delay=0.3)
    fake.record(NOMTP)
    out = tmp_path / "b"
    flags = ["--concurrency", "3", "--token-keys", "strings", "--server-cmd", "vllm serve m"]
    code, log = cli_capture(fake, out, fixture_suite(tmp_path), *flags)
    assert code == 0, log
    assert fake.completion_calls == 5 and fake.max_in_flight == 3  # the default is 4
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["server_command"] == "vllm serve m" and meta["settings"]["token_keys"] == "strings"
    for path in out.glob("completion_*.json"):
        assert "return_tokens_as_token_ids" not in json.loads(path.read_text())["request"]
    assert run_cli(["compare", str(NOMTP), str(out)])[0] == 0


def test_capture_repeat_sends_each_case_n_times_and_counts_distinct_outputs(
    tmp_path: Path, monkeypatch
) -> None:
    fake = FakeVllm()
    real = fake.complete

    def second_call_differs(body: dict[str, Any]) -> dict[str, Any]:
        answer = real(body)
        if fake.completion_calls == 2:  # alpha's second answer: another first token
            logprobs = answer["choices"][0]["logprobs"]
            logprobs["tokens"] = ["token_id:999", *logprobs["tokens"][1:]]
            logprobs["top_logprobs"][0] = {"token_id:999": -0.1, "token_id:1": -3.0}
        return answer

    monkeypatch.setattr(fake, "complete", second_call_differs)
    out = tmp_path / "b"
    code, log = cli_capture(fake, out, synthetic(tmp_path), "--repeat", "3", "--concurrency", "1")
    assert code == 0, log
    assert fake.completion_calls == 2 * 3
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["settings"]["repeat"] == 3
    assert meta["repeat_unique_sequences"] == {"completion_alpha": 2, "completion_beta": 1}


def test_capture_reference_scores_the_baseline_bundles_outputs(tmp_path: Path) -> None:
    suite = synthetic(tmp_path)
    base, cand = tmp_path / "base", tmp_path / "cand"
    assert cli_capture(FakeVllm(), base, suite, "--teacher-forced")[0] == 0
    code, log = cli_capture(
        FakeVllm(shift=0.3), cand, suite, "--teacher-forced", "--reference", str(base)
    )
    assert code == 0, log
    own = json.loads((base / "teacher_alpha.json").read_text())
    scored = json.loads((cand / "teacher_alpha.json").read_text())
    assert own["scored_from"] == "self" and scored["scored_from"] == str(base)
    assert scored["sequence"] == own["sequence"]
    assert json.loads((cand / "bundle.json").read_text())["teacher_forced"] == {
        "enabled": True,
        "reference": str(base),
    }


def test_calibrate_captures_runs_from_url_with_the_capture_flags(tmp_path: Path) -> None:
    """--runs bundles from --url (the default is 3), each captured under --concurrency and
    --token-keys, and every pair of them compared."""
    fake = FakeVllm(delay=0.1)
    gen, url = run_server(fake)
    out = tmp_path / "cal"
    try:
        code, log = run_cli(["calibrate", "--url", url, "--runs", "2", "--out", str(out),
                             "--suite", str(synthetic(tmp_path)), "--concurrency", "1",
                             "--token-keys", "strings"])  # fmt: skip
    finally:
        gen.close()
    assert code == 0, log
    assert fake.completion_calls == 2 * 2 and fake.max_in_flight == 1  # the default is 4
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == ["run_01", "run_02"]
    for run in runs:
        meta = json.loads((out / run / "bundle.json").read_text())
        assert meta["settings"]["token_keys"] == "strings"
    calibration = json.loads((out / "gates.json").read_text())["calibration"]
    assert calibration["bundles"] == [str(out / run) for run in runs]
    assert calibration["pairs"] == 1
