"""The root of every exception the package raises."""

from typing import Any


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
             ) -> BaseException:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class OAIPMHDagsterError(Exception):
    """Root of every exception this package raises. Each pickles as it is (a harvest's
    worker process sends its error back), whatever its constructor takes."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (type(self), self.args, self.__dict__))
