"""`gyre kld` end to end on stories260K (tests/e2e; run by scripts/test.sh's e2e stage with
GYRE_BIN and GYRE_FIXTURES): the JSON report, and --ref-device, which puts the reference on
another device (here the same one, so the model scores exactly as its reference)."""
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GYRE = os.environ.get("GYRE_BIN", str(ROOT / "build" / "gyre"))
FIXTURES = Path(os.environ.get("GYRE_FIXTURES", ROOT.parent / "shared" / "fixtures"))
MODEL = str(FIXTURES / "stories260K")
TEXT = str(FIXTURES / "text" / "tinystories-sample.txt")


def kld(*extra):
    out = subprocess.run(
        [GYRE, "kld", "-m", MODEL, "--ref", MODEL, "-f", TEXT, "--ctx", "128",
         "--max-windows", "3", "--json", *extra],
        capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_kld_of_a_model_against_itself_on_the_reference_device():
    r = kld("--device", "cpu", "--ref-device", "cpu")
    assert r["device"] == "cpu" and r["ref_device"] == "cpu"
    assert r["tokens"] > 100
    assert r["kld_mean"] < 1e-9
    assert r["top1_agreement"] == 1.0
    assert abs(r["ppl_ratio"] - 1.0) < 1e-9


def test_ref_device_defaults_to_the_models_device():
    r = kld("--device", "cpu")
    assert r["ref_device"] == "cpu"


def test_unknown_ref_device_is_a_clear_error():
    out = subprocess.run(
        [GYRE, "kld", "-m", MODEL, "--ref", MODEL, "-f", TEXT, "--device", "cpu",
         "--ref-device", "tpu"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "tpu" in out.stderr
    assert out.stderr.count("\n") <= 2
