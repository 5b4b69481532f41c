import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        help="rewrite the expected fixture outputs (fixtures/**/NAME.<target>.py and .diagnostics) from the tool",
    )


@pytest.fixture
def update_fixtures(request):
    return request.config.getoption("--update-fixtures")
