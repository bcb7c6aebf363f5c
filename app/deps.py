"""Dependencies shared by the routers."""
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from app.state import Playground


def get_playground(conn: HTTPConnection) -> Playground:
    return conn.app.state.playground


PlaygroundDep = Annotated[Playground, Depends(get_playground)]
__all__ = ["PlaygroundDep", "get_playground", "Request"]
