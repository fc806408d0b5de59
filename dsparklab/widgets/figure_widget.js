// The front end of dsparklab's LabFigureWidget: plotly's own FigureWidget front end,
// imported once per page rather than once per figure, and outside the 2 s anywidget
// gives a model to load its module (figure_widget.py says why).

// the page's imports of plotly's module, by bundle key: the first figure to ask imports it
const bundles = (globalThis.__dsparklabPlotlyBundles ??= new Map());

function plotlyModule(model) {
  const key = model.get("_bundle_key");
  if (!bundles.has(key)) {
    const blob = new Blob([model.get("_bundle")], { type: "text/javascript" });
    const url = URL.createObjectURL(blob);
    const imported = import(url).finally(() => URL.revokeObjectURL(url));
    // a failed import is not kept: the next figure tries again
    bundles.set(key, imported.catch((error) => {
      bundles.delete(key);
      throw error;
    }));
  }
  return bundles.get(key);
}

// The messages plotly's model side would have applied while its module loads, each with
// the value it carried. A figure sent whole (_widget_data, _widget_layout) already holds
// every message before it, so those are dropped.
function holdMessages(model) {
  const messages = [];
  const handlers = model.get("_held_traits").map((name) => [
    `change:${name}`,
    () => messages.push({ name, value: model.get(name) }),
  ]);
  const sentWhole = () => {
    messages.length = 0;
  };
  handlers.push(["change:_widget_data", sentWhole], ["change:_widget_layout", sentWhole]);
  for (const [event, handler] of handlers) model.on(event, handler);
  return {
    messages,
    stop: () => handlers.forEach(([event, handler]) => model.off(event, handler)),
  };
}

// plotly's front end for one figure, once its module is in. It sees the model through a
// proxy that reads a held message back while that message is replayed.
async function plotlyWidget(model, held) {
  let module;
  try {
    module = await plotlyModule(model);
  } finally {
    held.stop();  // nothing more to hold should the import fail
  }
  const listeners = new Map();
  let replayed = null;
  const proxy = {
    ...model,
    get: (name) => (replayed !== null && replayed.name === name ? replayed.value : model.get(name)),
    on(event, callback) {
      model.on(event, callback);
      listeners.set(event, [...(listeners.get(event) ?? []), callback]);
    },
  };
  // plotly 6-7's shape: a factory of {initialize, render}, initialize synchronous (its
  // listeners are in place when it returns, before any other message can arrive)
  if (typeof module.default !== "function") {
    throw new Error("plotly's widget module no longer exports a factory");
  }
  const widget = module.default();
  widget.initialize({ model: proxy });
  // each message on its own, as it would have come: one that fails loses only itself
  for (const message of held.messages) {
    replayed = message;
    for (const callback of listeners.get(`change:${message.name}`) ?? []) {
      try {
        callback();
      } catch (error) {
        console.error(`[dsparklab] replaying ${message.name}`, error);
      }
    }
  }
  replayed = null;
  return widget;
}

export default () => {
  let loaded;
  return {
    initialize({ model }) {
      loaded = plotlyWidget(model, holdMessages(model));
      loaded.catch((error) => console.error("[dsparklab] plotly's widget module failed", error));
    },
    async render({ model, el }) {
      return (await loaded).render({ model, el });
    },
  };
};
