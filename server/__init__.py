"""The launcher's side of a vLLM-Omni server: what to launch, how it runs, and who looks after it.

One way down, each package importing only the ones below it (tests/unit/test_import_graph.py
checks it):

    registry.py    the servers this process owns; the entry point for nodes/ and cli/
    supervision/   policy once a server runs: the Supervisor and its parts (restart, cancel,
                   recovery, keep-alive, wedge and head watches, adoption, several machines)
    process/       one server process: spawn under the watchdog, process group, port, key,
                   GPU lock, readiness, state, log files, deadlines
    launch/        what a launch is: the LaunchSpec and its flag tables, versions, LoRAs,
                   replica layout, the model's weights on disk
    logs/          reading the server's log: startup phases, progress, why it failed
    storage/       the launcher's own files under its data dir: private, never through a link
    config/        the local configuration (what no workflow may decide) and the server's
                   program and environment

Below them all: models/, client/ and errors/. From outside (nodes/, cli/, planner/)
only registry, config/, launch/ and storage/ are imported.
"""
