"""kvnumba.remote: copies between NIXL agents, in one process and across two."""
