"""`python -m bench.tls_buffer`: a kept-alive TLS connection's cost to the server's heap by
read buffer (issue 41 item 5)."""

from __future__ import annotations

import pytest

from bench import tls_buffer


@pytest.mark.parametrize("given", ["100", "abc", ","])
def test_a_buffer_size_under_one_tls_record_or_not_a_number_is_refused(capsys, given):
    with pytest.raises(SystemExit) as e:
        tls_buffer.main(["--buffers", given])
    assert e.value.code == 2
    assert "--buffers takes" in capsys.readouterr().err


def test_two_connections_cost_the_server_more_with_the_larger_buffer():
    got = tls_buffer.run(2, [256 * 1024, 64 * 1024])
    big, small = got["sizes"]
    assert [r["connections"] for r in big["rows"]] == [1, 2]
    assert (big["buffer_bytes"], small["buffer_bytes"]) == (256 * 1024, 64 * 1024)
    # each connection holds one read buffer on the server: 192 KiB a connection apart
    assert big["rows"][-1]["malloc_in_use_mib"] - small["rows"][-1]["malloc_in_use_mib"] \
        == pytest.approx(2 * 192 / 1024, abs=0.1)
