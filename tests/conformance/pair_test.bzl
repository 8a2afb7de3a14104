"""The two runs of one conformance program: against Intel's libpsm2 and psmd."""

def _run_pair(program, name, flags, data, env = {}):
    """One run_pair.sh test of `program`: run_pair.sh FLAGS... PROGRAM."""
    native.sh_test(
        name = name,
        size = "medium",
        srcs = ["run_pair.sh"],
        args = flags + ["$(location :%s)" % program],
        data = [":" + program, "//daemon:psmd", "//scripts:workdir"] + data,
        env = env,
    )

def pair_tests(program, ranks = 2, nodes = 0, workers = 0,
               nodes_workers_ranks = 0, upgrades = False):
    """Defines <program>_intel and <program>_psmd, each run by run_pair.sh.

    Args:
      program: name of the cc_binary in this package.
      ranks: how many ranks run_pair.sh starts.
      workers: if not 0, also <program>_psmd_workers<N>: psmd with that many
        engine shards, the ranks placed on different ones, and a check that
        every shard carried traffic and messages crossed between them.
      nodes: if not 0, also <program>_nodes: the psmd run with that many
        daemons linked by the fabric (rank r on daemon r % nodes), and
        <program>_nodes_ofi: the same over the ofi backend on tcp;ofi_rxm,
        and <program>_nodes_ofi_udp: on udp;ofi_rxd (datagrams, the
        provider's own reliability; issue 34 asks for two providers of
        different properties).
      nodes_workers_ranks: if not 0 (with nodes and workers), also
        <program>_nodes_workers<N>: that many ranks over `nodes` daemons of
        `workers` shards each (two ranks or more per daemon, so that every
        shard has one), and the shard check on every daemon.
      upgrades: also <program>_psmd_upgrades: psmd handed over to itself
        every 200 ms while the ranks run (psmctl upgrade).
    """
    r = ["--ranks", str(ranks)]
    if nodes:
        for suffix, env in [
            ("_nodes", {}),
            ("_nodes_ofi", {"PSMD_TEST_OFI_PROVIDER": "tcp;ofi_rxm"}),
            ("_nodes_ofi_udp", {"PSMD_TEST_OFI_PROVIDER": "udp;ofi_rxd"}),
        ]:
            _run_pair(program, program + suffix,
                      r + ["--daemons", str(nodes), "psmd-nodes"],
                      ["//scripts:nodes"], env)
    if nodes and workers and nodes_workers_ranks:
        _run_pair(program, program + "_nodes_workers" + str(workers),
                  ["--ranks", str(nodes_workers_ranks), "--daemons", str(nodes),
                   "--workers", str(workers), "psmd-nodes"],
                  ["//scripts:nodes", "//tests:check_shards.py", "//tools:psmctl"])
    if workers:
        _run_pair(program, program + "_psmd_workers" + str(workers),
                  r + ["--workers", str(workers), "psmd"],
                  ["//tests:check_shards.py", "//tools:psmctl"])
    if upgrades:
        _run_pair(program, program + "_psmd_upgrades", r + ["--upgrades", "psmd"],
                  ["//tools:psmctl"])
    for impl in ["intel", "psmd"]:
        _run_pair(program, program + "_" + impl, r + [impl],
                  ["//scripts:fake_hfi"])
