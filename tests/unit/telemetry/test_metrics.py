"""Request accounting: in flight goes up and down, finished only up."""

from chatqna.telemetry.metrics import RequestActivity


def test_in_flight_and_finished() -> None:
    activity = RequestActivity()
    activity.started()
    activity.started()
    activity.ended()
    assert (activity.in_flight, activity.finished) == (1, 1)
