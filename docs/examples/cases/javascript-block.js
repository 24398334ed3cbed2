'use strict';

// Debounce: call fn only after `wait` ms have passed without another call.
function debounce(fn, wait) {
  let timer = null;
  return function (...args) {
    ‸
  };
}

const log = debounce((msg) => console.log(msg), 100);
log('first');
log('second');
