"""The API's routers, one per concern; each module's `router(api)` makes its APIRouter
from the app's shared state (clients/api/state.py). None imports another."""
