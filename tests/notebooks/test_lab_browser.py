"""notebooks/explore.py as a user opens it: JupyterLab in a real Chromium, all cells run.

JupyterLab starts on a free 127.0.0.1 port with a token, its config, runtime, data and
settings dirs under tmp, and the repo's ``.jupyter/`` on ``JUPYTER_CONFIG_PATH`` as
``make lab`` has it (jupytext's notebook viewer is the default for ``.py``). A copy of
explore.py sits beside a kmer-4 store of demo-v1, so its ``store = "store"`` parameter
points there unchanged. Debian's Chromium, driven by Playwright, opens the file, runs
every cell from the Run menu, and the outputs are read off the page.

Skipped where no chromium binary exists (Debian: ``apt-get install -y chromium``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from embedcache.cli import main
from scripts.screenshot_report import FLAGS, find_chromium
from tests.service.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = find_chromium()
# every code cell numbered, or a cell failed and nothing runs any more
_FINISHED = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
  const busy = prompts.some((p) => p.textContent.includes('*'));
  const failed = document.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]');
  return prompts.length > 0 && !busy
    && (failed !== null || prompts.every((p) => /\\[\\d+\\]/.test(p.textContent)));
}"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")


@contextlib.contextmanager
def jupyter_lab(root: Path, tmp: Path):
    """A JupyterLab server on ``root``; yields its base URL and token."""
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env |= {
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_CONFIG_PATH": str(ROOT / ".jupyter"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "PYTHONPATH": str(ROOT),  # the kernel imports this checkout
    }
    options = [
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={tmp / 'settings'}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        # no extension index from the network; CI runs as root
        "--LabApp.extension_manager=readonly",
        "--ServerApp.allow_root=True",
    ]
    log = (tmp / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", *options],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp / "lab.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/status?token={token}").status_code == 200:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"JupyterLab not up:\n{(tmp / 'lab.log').read_text()}")
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_for_idle_kernel(url: str, token: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sessions = httpx.get(f"{url}/api/sessions?token={token}").json()
        if [s for s in sessions if s["kernel"]["execution_state"] == "idle"]:
            return
        time.sleep(0.2)
    pytest.fail(f"no idle kernel after {timeout} s: {sessions}")


def test_explore_runs_in_jupyterlab_and_shows_its_outputs(tmp_path):
    from playwright.sync_api import sync_playwright

    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / "explore.py", root / "explore.py")
    args = ["embeddings", "--model", "kmer-4", "--version", "demo-v1"]
    assert main([*args, "--store", str(root / "store"), "--no-progress"]) == 0

    with jupyter_lab(root, tmp_path) as (url, token), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=list(FLAGS))
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/lab/tree/explore.py?token={token}")
            # opened as a notebook (not the text editor), its kernel started (the
            # page says idle before a kernel exists, so the server is asked first)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=60_000)
            wait_for_idle_kernel(url, token)
            page.wait_for_selector(
                '.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000
            )
            page.click('.lm-MenuBar-item:has-text("Run")')
            page.click('.lm-Menu-item[data-command="runmenu:run-all"]')
            page.wait_for_function(_FINISHED, timeout=180_000)
            stderr = page.locator(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
            ).all_inner_texts()
            prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
            n_figures = page.locator(".jp-OutputArea-output img").count()
            tables = page.locator(".jp-OutputArea-output table").all_inner_texts()
            text = page.locator(".jp-NotebookPanel").inner_text()
        finally:
            browser.close()

    assert stderr == []  # no cell failed, nothing warned
    assert len(prompts) == 7
    assert [p.strip() for p in prompts] == [f"[{i}]:" for i in range(1, 8)]
    assert "kmer-4 on demo-v1 (test items)" in text
    assert n_figures == 1  # the PCA projection
    assert any("human_enhancers_cohn" in t for t in tables)  # per-dataset results
    assert "kmer-4: test items its probe got wrong" in text
    assert "first 20 misclassified test items of" in text
    assert len(tables) >= 3
