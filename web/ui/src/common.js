// What both pages share: settings from the page, the token from the address, the base map.
import L from 'leaflet';

export function readConfig() {
  const el = document.getElementById('config');
  return el ? JSON.parse(el.textContent) : {};
}

// The token comes in the address (`?token=`); it is kept in memory only and removed from the
// address bar and history, so it is not bookmarked or shown over a shoulder.
export function takeToken() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get('token');
  if (token !== null) {
    url.searchParams.delete('token');
    window.history.replaceState(null, '', url.pathname + url.search + url.hash);
  }
  return token && token.trim() ? token.trim() : null;
}

// A map on a plain background with a scale; tiles only when a tile server is configured.
export function baseMap(id, cfg, options = {}) {
  const map = L.map(id, { preferCanvas: true, attributionControl: true, ...options });
  map.attributionControl.setPrefix(false);
  if (cfg.tile_url) {
    L.tileLayer(cfg.tile_url, { attribution: cfg.tile_attribution || '', maxZoom: 19 }).addTo(map);
  } else {
    document.getElementById(id).classList.add('plain');
  }
  L.control.scale({ imperial: false, position: 'bottomleft' }).addTo(map);
  return map;
}

// A full-page refusal: the page stops and shows why, with nothing of the data.
export function refuse(title, detail) {
  const el = document.getElementById('refusal');
  el.querySelector('h1').textContent = title;
  el.querySelector('p').textContent = detail;
  el.hidden = false;
  document.body.classList.add('refused');
}

export function ago(seconds) {
  if (seconds == null || !isFinite(seconds) || seconds < 0) return '–';
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}
