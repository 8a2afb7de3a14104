"""The two runs of one conformance program: against Intel's libpsm2 and psmd."""

def pair_tests(program, ranks = 2):
    """Defines <program>_intel and <program>_psmd, each run by run_pair.sh.

    Args:
      program: name of the cc_binary in this package.
      ranks: how many ranks run_pair.sh starts.
    """
    for impl in ["intel", "psmd"]:
        native.sh_test(
            name = program + "_" + impl,
            size = "medium",
            srcs = ["run_pair.sh"],
            args = ["--ranks", str(ranks), impl, "$(location :%s)" % program],
            data = [
                ":" + program,
                "//daemon:psmd",
                "//scripts:fake_hfi",
                "//scripts:workdir",
            ],
        )
