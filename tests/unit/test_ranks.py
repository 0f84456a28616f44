"""distil.ranks: the launcher's RANK, read by the code that runs before a process group exists."""

from distil.ranks import is_first_rank, launch_rank


def test_rank_from_the_launcher_and_zero_when_launched_alone(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert launch_rank() == 0 and is_first_rank()
    monkeypatch.setenv("RANK", "")  # set but empty, as some launch scripts leave it
    assert launch_rank() == 0 and is_first_rank()
    monkeypatch.setenv("RANK", "3")
    assert launch_rank() == 3 and not is_first_rank()
