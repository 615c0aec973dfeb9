"""The case classes of tools/hostile_probe.py: common.py holds the shared context, running and
classification; shard, config, plan, cli, pipeline (with pipeline_peers) and http_server hold one
class of cases each."""
