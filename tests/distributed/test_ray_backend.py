"""The ``ray`` distributed executor backend on a two-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: two raylets, each with its own resources). Each node has 1 CPU and
each rank's bundle asks for 1 CPU, so rank 0 (this process, on the driver's node) and rank 1 (an
actor) cannot share a node: the tests assert it from the nodes the placement group chose and the
actor reported. PP=2 and TP=2 across the nodes give the greedy tokens of one process (fp32, the tiny
random Llama); a rank's actor killed mid-request fails the request with one line naming its node.
One cluster for the module (Ray starts slowly); each engine starts its own actors."""

from __future__ import annotations

import os
import signal

import pytest

ray = pytest.importorskip("ray", reason="the ray backend needs Ray: pip install 'hetero-core[ray]'")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from hetero_core import LLM  # noqa: E402
from hetero_core.builder import build_engine  # noqa: E402
from hetero_core.engine.requests.params import SamplingParams  # noqa: E402
from hetero_core.errors import ConfigError, ExecutorDeadError  # noqa: E402
from hetero_core.plugin_system.discovery import load_plugins  # noqa: E402
from hetero_core.settings import load_settings  # noqa: E402
from tests.process_tree import still_alive  # noqa: E402

OBJECT_STORE_BYTES = 100 * 1024**2  # per node: nothing large goes through it
PROMPTS = [[5, 17, 33, 2, 48, 71, 9, 64] + [10 + i, 20 + i] * (1 + i % 3) for i in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
OPTIONS = dict(tokenizer="byte", block_size=4, max_model_len=128, dtype="float32")


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node on this machine, 1 CPU each; this process is the driver."""
    from ray.cluster_utils import Cluster

    node = dict(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES)
    cluster = Cluster(initialize_head=True, head_node_args=dict(node, include_dashboard=False))
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="warning")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.model.tiny_models import save_tiny_model

    directory = tmp_path_factory.mktemp("ray_backend") / "llama"
    save_tiny_model("llama", directory)
    return directory


@pytest.fixture(scope="module")
def reference(llama_dir):
    """The greedy tokens of one process."""
    engine = make_engine(llama_dir)
    try:
        return [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()


def make_engine(model_dir, **overrides):
    settings = load_settings(model=str(model_dir), **OPTIONS, **overrides)
    return build_engine(settings, load_plugins(entry_points=[]))


def assert_ranks_on_two_nodes(executor, cluster) -> None:
    """Rank 0 on this process's node, rank 1 (its actor's report) on the other node of the cluster;
    the rendezvous at this node's address as Ray knows it (what other machines reach)."""
    here = ray.get_runtime_context().get_node_id()
    assert executor.rendezvous_host == ray.util.get_node_ip_address()
    (worker,) = executor._workers
    assert executor.worker_nodes == [here, worker.node_id]
    assert worker.node_id != here
    assert {here, worker.node_id} == {node.node_id for node in cluster.list_all_nodes()}


def test_two_stages_on_two_nodes_give_the_greedy_tokens_of_one(two_nodes, llama_dir, reference):
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    with LLM(str(llama_dir), pipeline_parallel_size=2, distributed_executor_backend="ray", **OPTIONS) as llm:
        executor = llm.engine.executor
        assert_ranks_on_two_nodes(executor, two_nodes)
        pids = executor.worker_pids
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == reference
    assert not still_alive(pids, timeout=30)  # the actor's process is gone after shutdown


def test_two_tensor_parallel_ranks_on_two_nodes_give_the_greedy_tokens_of_one(
    two_nodes, llama_dir, reference
):
    engine = make_engine(llama_dir, tensor_parallel_size=2, distributed_executor_backend="ray")
    try:
        assert_ranks_on_two_nodes(engine.executor, two_nodes)
        got = [o.output_token_ids for o in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.shutdown()
    assert got == reference


def test_hetero_run_across_the_cluster_prints_the_text_of_one_process(two_nodes, llama_dir):
    """A second driver (the command) joins the cluster at its address; its rank 1 lands on the node
    its rank 0 is not on, as in-process."""
    from tests.cli_helpers import hetero

    args = ["--model", str(llama_dir), "--tokenizer", "byte", "--dtype", "float32", "--block-size", "4"]
    args += ["--max-model-len", "128", "--max-tokens", "12", "--temperature", "0", "--no-chat"]
    ray_args = ["-pp", "2", "--distributed-executor-backend", "ray", "--ray-address", two_nodes.address]
    texts = {}
    for name, extra in (("one process", []), ("ray", ray_args)):
        result = hetero("run", *args, *extra, "HELLO, 2026", timeout=300)  # bytes < the vocabulary
        assert result.returncode == 0, result.stderr
        texts[name] = result.stdout
    assert texts["ray"] == texts["one process"] and texts["ray"].strip()


def test_a_rank_killed_mid_request_fails_it_naming_its_node(two_nodes, llama_dir):
    engine = make_engine(llama_dir, pipeline_parallel_size=2, distributed_executor_backend="ray")
    try:
        (worker,) = engine.executor._workers
        for prompt in PROMPTS:
            engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=90, ignore_eos=True))
        for _ in range(3):
            engine.step()
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.raises(ExecutorDeadError) as error:
            for _ in range(500):  # a step takes milliseconds: the kill lands long before the end
                engine.step()
        message = str(error.value)
        node = f"on node {worker.node_ip} ({worker.node_id[:8]})"
        died = "died: its worker process has died (Ray: exit type"
        assert f"pipeline-parallel worker rank 1 (stage 1) {node} {died}" in message
        assert "\n" not in message and message.endswith("; the engine has stopped")
        with pytest.raises(ExecutorDeadError, match="stage 1"):  # and the engine stays stopped
            engine.step()
    finally:
        engine.shutdown()


def test_an_exception_on_a_remote_rank_fails_the_engine_with_it(two_nodes, llama_dir):
    import tests.distributed.tp_faults as tp_faults

    options = {k: v for k, v in OPTIONS.items() if k != "dtype"}  # its ranks run float32 anyway
    settings = load_settings(
        model=str(llama_dir),
        **options,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        executor={"name": "faulty", "faulty": {"rank": 1, "after": 2}},
    )
    engine = build_engine(settings, load_plugins(entry_points=[], extra_plugins=[("faulty", tp_faults)]))
    try:
        (worker,) = engine.executor._workers
        with pytest.raises(ExecutorDeadError) as error:
            engine.generate(PROMPTS, GREEDY)
        node = f"on node {worker.node_ip} ({worker.node_id[:8]})"
        assert f"tensor-parallel worker rank 1 {node} failed: RuntimeError: injected fault on rank 1" in str(
            error.value
        )
    finally:
        engine.shutdown()


def test_more_ranks_than_the_cluster_has_room_for_are_refused_in_one_line(two_nodes, llama_dir, monkeypatch):
    from hetero_core.distributed import ray_launcher

    monkeypatch.setattr(ray_launcher, "PLACEMENT_TIMEOUT_S", 2.0)  # no room will appear: do not wait long
    with pytest.raises(ConfigError) as error:
        make_engine(
            llama_dir, tensor_parallel_size=2, pipeline_parallel_size=2, distributed_executor_backend="ray"
        )
    message = str(error.value)
    assert (
        message.startswith("the Ray cluster found no room for 4 ranks of 1 CPU each") and "\n" not in message
    )
    assert ray.util.placement_group_table() == {} or all(
        group["state"] == "REMOVED" for group in ray.util.placement_group_table().values()
    )


def test_a_ray_client_address_is_refused(llama_dir):
    with pytest.raises(ConfigError, match="not a Ray Client address"):
        make_engine(
            llama_dir,
            pipeline_parallel_size=2,
            distributed_executor_backend="ray",
            ray_address="ray://head:10001",
        )


def test_cuda_ranks_are_refused_until_each_rank_gets_its_device():
    from hetero_core.distributed.ray_launcher import RayLauncher

    with pytest.raises(ConfigError, match="runs CPU ranks \\(gloo\\) so far, not device 'cuda:0'"):
        RayLauncher(None, "cuda:0")
